"""PostgreSQL: row claims with FOR UPDATE SKIP LOCKED in READ COMMITTED transactions, one
statement per claim and per finished batch (UPDATE ... RETURNING), and LISTEN/NOTIFY."""

from __future__ import annotations

import select
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError

from .base import Dialect, Finished, FinishReport
from .functions import DbNow

if TYPE_CHECKING:
    from ..models import Job, JobQuerySet

# SQLSTATEs worth retrying the whole transaction for: serialization failure, deadlock, and
# lock_not_available (a lock wait ran into the worker's lock_timeout).
_TRANSIENT_SQLSTATES = {"40001", "40P01", "55P03"}
CHANNEL = "django_jobqueue"  # the LISTEN/NOTIFY channel; the payload is the queue's name
_TRIGGER_FUNCTION = "django_jobqueue_notify_ready"


class PostgreSQLDialect(Dialect):
    vendor = "postgresql"
    can_return_rows_from_update = True
    supports_listen_notify = True
    claim_strategy = "UPDATE ... RETURNING over SELECT ... FOR UPDATE SKIP LOCKED (READ COMMITTED)"

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

    def _bound_waits(self, lock_timeout: float, idle_timeout: float | None) -> None:
        with self.connection.cursor() as cursor:
            cursor.execute(f"SET lock_timeout = '{max(1, int(lock_timeout * 1000))}ms'")
            if idle_timeout:
                cursor.execute(
                    "SET idle_in_transaction_session_timeout = "
                    f"'{max(1, int(idle_timeout * 1000))}ms'"
                )

    # -- wake-up -----------------------------------------------------------------------------

    def notify(self, queues: Iterable[str]) -> None:
        # NOTIFY inside the transaction is delivered at its commit, and never on rollback.
        with self.connection.cursor() as cursor:
            for queue in sorted(set(queues)):
                cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, queue])

    def create_notify_trigger(self, schema_editor: Any, table: str) -> None:
        # One NOTIFY per INSERT statement and queue (not per row), sent by the enqueuing
        # transaction, so producers in any process or host wake the workers on commit.
        qn = schema_editor.quote_name
        schema_editor.execute(
            f"""
            CREATE OR REPLACE FUNCTION {_TRIGGER_FUNCTION}() RETURNS trigger
            LANGUAGE plpgsql AS $$
            BEGIN
                PERFORM pg_notify('{CHANNEL}', q.queue)
                FROM (SELECT DISTINCT queue FROM new_rows WHERE state = 'ready') AS q;
                RETURN NULL;
            END $$
            """
        )
        schema_editor.execute(
            f"CREATE TRIGGER {_TRIGGER_FUNCTION} AFTER INSERT ON {qn(table)} "
            f"REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT "
            f"EXECUTE FUNCTION {_TRIGGER_FUNCTION}()"
        )

    def drop_notify_trigger(self, schema_editor: Any, table: str) -> None:
        qn = schema_editor.quote_name
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {_TRIGGER_FUNCTION} ON {qn(table)}")
        schema_editor.execute(f"DROP FUNCTION IF EXISTS {_TRIGGER_FUNCTION}()")

    def listener(self) -> Listener:
        """Return a LISTEN connection of this thread (its own, never used for anything else)."""
        return Listener(self)

    # -- the claim and the finish: one statement each ----------------------------------------

    def claim_ready(
        self, ready: JobQuerySet, *, owner: str, limit: int, lease_ttl: float
    ) -> list[Job]:
        from ..models import Job

        inner, params = self.compile_query(
            self.lock(ready.order_by("-priority", "pk").values("pk"))[:limit]
        )
        sets, set_params = self.claim_sets(owner, lease_ttl, prefix="j.")
        table = self.qn(Job._meta.db_table)
        sql = (
            f"WITH c (id) AS ({inner}) UPDATE {table} AS j SET {sets} FROM c WHERE j.id = c.id "
            f"RETURNING {self.claim_columns('j.')}"
        )
        rows = list(Job.objects.using(self.using).raw(sql, [*params, *set_params]))
        rows.sort(key=lambda r: (-r.priority, r.pk))
        return rows

    def mark_claimed(self, rows: list[Job], *, owner: str, lease_ttl: float) -> list[Job]:
        from ..models import Job

        if not rows:
            return []
        sets, set_params = self.claim_sets(owner, lease_ttl, prefix="j.")
        table = self.qn(Job._meta.db_table)
        sql = (
            f"UPDATE {table} AS j SET {sets} WHERE j.id = ANY(%s) "
            f"RETURNING {self.claim_columns('j.')}"
        )
        order = {r.pk: n for n, r in enumerate(rows)}
        claimed = list(Job.objects.using(self.using).raw(sql, [*set_params, [r.pk for r in rows]]))
        claimed.sort(key=lambda r: order[r.pk])
        return claimed

    def json_append_sql(self, column: str) -> str:
        return f"{column} || jsonb_build_array(%s::text)"

    def finish_many(
        self, *, owner: str, items: Sequence[tuple[int, int, str | None]]
    ) -> FinishReport:
        from ..models import Job

        table = self.qn(Job._meta.db_table)
        now, _ = self.compile(DbNow())
        # The rows are locked with SKIP LOCKED first: a row an application transaction holds
        # locked is left for the next batch instead of stalling every other outcome.
        sql = f"""
            WITH v AS (
                SELECT * FROM unnest(%s::bigint[], %s::int[], %s::text[]) AS v(id, attempt, result)
            ), locked AS (
                SELECT j.id, j.cancel_requested FROM {table} AS j JOIN v ON v.id = j.id
                WHERE j.attempts = v.attempt AND j.lease_owner = %s
                  AND j.state IN ('leased', 'running')
                FOR UPDATE OF j SKIP LOCKED
            )
            UPDATE {table} AS j SET
                state = CASE WHEN l.cancel_requested THEN 'cancelled' ELSE 'done' END,
                result = CASE WHEN l.cancel_requested THEN NULL ELSE v.result::jsonb END,
                lease_owner = NULL, lease_expires = NULL, unique_slot = NULL,
                finished_at = {now}, updated_at = {now}
            FROM locked AS l JOIN v ON v.id = l.id
            WHERE j.id = l.id
            RETURNING j.id, j.state, j.parent_id, j.has_dependents
        """
        params: list[Any] = [
            [i for i, _, _ in items],
            [a for _, a, _ in items],
            [text for _, _, text in items],
            owner,
        ]
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        report = FinishReport(
            [Finished(pk, state, parent, deps) for pk, state, parent, deps in rows]
        )
        self._sort_missing(
            report, {i: a for i, a, _ in items}, {f.job_id for f in report.finished}, owner
        )
        return report


class Listener:
    """A LISTEN on the queue channel, on the calling thread's own connection."""

    def __init__(self, dialect: PostgreSQLDialect) -> None:
        self.dialect = dialect
        conn = dialect.connection
        conn.ensure_connection()
        if conn.in_atomic_block or not conn.get_autocommit():
            raise RuntimeError("LISTEN needs a connection in autocommit mode.")
        self.raw: Any = conn.connection
        with conn.cursor() as cursor:
            cursor.execute(f"LISTEN {CHANNEL}")

    def wait(self, timeout: float) -> list[str]:
        """Block up to `timeout` seconds for notifications; return their payloads (queues)."""
        if hasattr(self.raw, "notifies") and callable(self.raw.notifies):  # psycopg 3
            return [n.payload for n in self.raw.notifies(timeout=timeout, stop_after=1)]
        # psycopg2: wait for the socket, then collect what arrived.
        if select.select([self.raw], [], [], timeout)[0]:
            self.raw.poll()
        payloads = [n.payload for n in self.raw.notifies]
        self.raw.notifies.clear()
        return payloads

    def close(self) -> None:
        self.dialect.connection.close()
