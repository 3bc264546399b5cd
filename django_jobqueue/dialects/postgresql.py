"""PostgreSQL: row claims with FOR UPDATE SKIP LOCKED in READ COMMITTED transactions."""

from __future__ import annotations

from django.db import DatabaseError

from .base import Dialect

# SQLSTATEs worth retrying the whole transaction for: serialization failure, deadlock.
_TRANSIENT_SQLSTATES = {"40001", "40P01"}


class PostgreSQLDialect(Dialect):
    vendor = "postgresql"
    claim_strategy = "SELECT ... FOR UPDATE SKIP LOCKED (READ COMMITTED)"

    def begin(self) -> None:
        # READ COMMITTED is PostgreSQL's default; pin it only when the project configured
        # another level, so each claim statement sees rows committed after the transaction began.
        conn = self.connection
        level = conn.settings_dict.get("OPTIONS", {}).get("isolation_level")
        if level is not None and str(level).upper().replace("_", " ") not in (
            "READ COMMITTED",
            "IsolationLevel.READ COMMITTED",
        ):
            with conn.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")

    def is_transient(self, exc: BaseException) -> bool:
        cause = exc.__cause__
        # psycopg 3 names it sqlstate, psycopg2 pgcode.
        code = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
        return isinstance(exc, DatabaseError) and code in _TRANSIENT_SQLSTATES
