"""MySQL 8.0.1+ and MariaDB 10.6+: exclusive FOR UPDATE SKIP LOCKED, READ COMMITTED pinned."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any

from django.core import checks
from django.core.exceptions import EmptyResultSet
from django.db import DatabaseError
from django.db.models import Expression, F, Func, JSONField, QuerySet, Value

from ..exceptions import UnsupportedDatabaseError
from ..models import Job
from .base import Dialect
from .transactions import statement_bound

MYSQL_MIN = (8, 0, 1)
MARIADB_MIN = (10, 6)
# Server error codes worth retrying the whole transaction for: lock wait timeout, deadlock.
_TRANSIENT_CODES = {1205, 1213}


def version_error(is_mariadb: bool, version: tuple[int, ...]) -> str | None:
    """Return why this server version cannot run the queue, or None when it can."""
    minimum = MARIADB_MIN if is_mariadb else MYSQL_MIN
    if tuple(version[: len(minimum)]) >= minimum:
        return None
    flavour = "MariaDB" if is_mariadb else "MySQL"
    return (
        f"{flavour} {'.'.join(map(str, version))} is too old: SKIP LOCKED needs "
        f"{flavour} {'.'.join(map(str, minimum))} or newer (it is a syntax error before)."
    )


class MySQLDialect(Dialect):
    vendor = "mysql"
    claim_strategy = "SELECT ... FOR UPDATE SKIP LOCKED (exclusive, READ COMMITTED pinned)"
    _budget: int | None = None  # see document_budget()
    # An INSERT ... SELECT takes the table's AUTO-INC lock: a grant that upserts a minute's
    # spend row twice (a deferred settlement's, then its own) waits for it while holding the
    # row, which a settlement of another job, holding the AUTO-INC lock, waits for: deadlock.
    # The deferred records are written in a transaction of their own, before the grant's.
    can_defer_into_grant = False

    def _add_on_conflict(self, table: str, keys: Sequence[str], value: str) -> str:
        # MySQL names no conflict target: ON DUPLICATE KEY UPDATE, which the unique key of
        # `keys` triggers (VALUES() reads the row's inserted value, on MariaDB and MySQL 8).
        column = self.qn(value)
        return f"ON DUPLICATE KEY UPDATE {column} = {column} + VALUES({column})"

    def _touch_on_conflict(self, key: str) -> str:
        # ON DUPLICATE KEY UPDATE takes the existing row's exclusive lock at once, where
        # INSERT IGNORE's shared one, upgraded by a later FOR UPDATE, deadlocks two joiners.
        return "ON DUPLICATE KEY UPDATE updated_at = VALUES(updated_at)"

    def hinted_sql(self, sql: str, indexes: Sequence[str]) -> str:
        # Left to itself, the optimizer took the ready index (state, priority, id), whose
        # order is the claim's, for a read of one group's or one queue's ready jobs, and read
        # every other group's or queue's ready jobs ahead of them (24 ms instead of 0.4 ms
        # behind 20,000 jobs), or took the waiting-queue index and sorted.
        if not indexes:
            return sql
        table, names = self.qn(Job._meta.db_table), ", ".join(map(self.qn, indexes))
        return sql.replace(f"FROM {table}", f"FROM {table} FORCE INDEX ({names})", 1)

    def read_through(self, query: QuerySet[Any], indexes: Sequence[str]) -> list[Any]:
        if not indexes:
            return list(query)
        compiler = query.query.get_compiler(using=self.using)
        try:
            sql, params = compiler.as_sql()
        except EmptyResultSet:  # a filter that matches nothing (no handler types)
            return []
        with self.connection.cursor() as cursor:
            cursor.execute(self.hinted_sql(sql, indexes), params)
            rows = cursor.fetchall()
        # The ORM's conversions of the values (JSON, booleans, datetimes), as it applies them.
        converters = compiler.get_converters([column for column, _, _ in compiler.select])
        return list(compiler.apply_converters(rows, converters)) if converters else list(rows)

    def check_server(self) -> None:
        conn: Any = self.connection
        conn.ensure_connection()
        problem = version_error(conn.mysql_is_mariadb, conn.mysql_version)
        if problem:
            raise UnsupportedDatabaseError(problem)
        with conn.cursor() as cursor:
            cursor.execute(
                "SELECT ENGINE FROM information_schema.TABLES "
                "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
                ["django_jobqueue_job"],
            )
            row: Any = cursor.fetchone()
        if row is not None and str(row[0]).upper() != "INNODB":
            raise UnsupportedDatabaseError(
                f"Table django_jobqueue_job uses the {row[0]} engine; row locks and "
                "SKIP LOCKED need InnoDB (ALTER TABLE django_jobqueue_job ENGINE=InnoDB)."
            )

    def uses_any_sql(self, names: Sequence[str]) -> tuple[str, list[Any]]:
        # A path per name, the key quoted as JSON does it (as Django's KeyTransform).
        marks = ", ".join(["%s"] * len(names))
        return f"JSON_CONTAINS_PATH(uses, 'one', {marks})", [f"$.{json.dumps(n)}" for n in names]

    def system_checks(self) -> list[checks.CheckMessage]:
        conn: Any = self.connection
        conn.ensure_connection()
        problem = version_error(conn.mysql_is_mariadb, conn.mysql_version)
        if problem:
            return [checks.Error(problem, id="django_jobqueue.E002")]
        # The worker pins READ COMMITTED for its own transactions (see begin()); the
        # project's transactions, which enqueue(), cancel() and retry() run in, keep theirs.
        level = conn.settings_dict.get("OPTIONS", {}).get("isolation_level")
        if level is not None and str(level).lower() != "read committed":
            return [
                checks.Warning(
                    f"Database {self.using!r} runs transactions at {level!r}: enqueue(), "
                    "cancel() and retry() run in your transaction and need READ COMMITTED to "
                    "see concurrent workers' commits.",
                    hint="Remove 'isolation_level' from OPTIONS (Django's default is READ "
                    "COMMITTED) or set it to 'read committed'.",
                    id="django_jobqueue.W004",
                )
            ]
        return []

    def describe(self) -> str:
        conn: Any = self.connection
        conn.ensure_connection()
        flavour = "MariaDB" if conn.mysql_is_mariadb else "MySQL"
        return f"{flavour} {conn.mysql_server_info}"

    def begin(self) -> None:
        # MySQL's default is REPEATABLE READ, whose snapshot can hide rows committed after the
        # transaction began. Django connects with READ COMMITTED unless the project chose
        # otherwise; pin it for this transaction when it did (allowed before the first statement).
        level = getattr(self.connection, "isolation_level", None)
        if level != "read committed":
            with self.connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")

    @contextmanager
    def transaction_waits(self, lock_timeout: float, idle_timeout: float | None) -> Iterator[None]:
        values = {"innodb_lock_wait_timeout": str(max(1, round(lock_timeout)))}
        # MariaDB ends a transaction left idle this long; MySQL 8 has no such setting. No
        # statement runs longer either (MySQL bounds only its SELECTs, the locking reads).
        if idle_timeout:
            values.update(self._statement_bound(statement_bound(lock_timeout, idle_timeout)))
            if self.connection.mysql_is_mariadb:  # type: ignore[attr-defined]
                values["idle_transaction_timeout"] = str(max(1, round(idle_timeout)))
        with self._session_values(values):
            yield

    @contextmanager
    def statement_timeout(self, timeout: float) -> Iterator[None]:
        # MariaDB bounds every statement (max_statement_time, seconds); MySQL only SELECTs,
        # the locking read included (max_execution_time, ms), and its UPDATE by primary key
        # waits for locks no longer than innodb_lock_wait_timeout.
        with self._session_values(self._statement_bound(timeout)):
            yield

    def _statement_bound(self, timeout: float) -> dict[str, str]:
        if self.connection.mysql_is_mariadb:  # type: ignore[attr-defined]
            return {"max_statement_time": f"{max(0.001, timeout):.3f}"}
        return {"max_execution_time": str(max(1, int(timeout * 1000)))}

    @contextmanager
    def _session_values(self, values: dict[str, str]) -> Iterator[None]:
        """Give the session `values` inside this block, then its own back, leaving no trace.

        MySQL and MariaDB have no transaction-local variables (PostgreSQL's SET LOCAL), and
        MariaDB's SET STATEMENT ... FOR covers one statement of SQL the ORM writes. Used inside
        a transaction: the values are given back before it ends, so a pooler that hands the
        server connection to another client after the COMMIT or ROLLBACK hands on none of
        them (nor the user variables that kept the old values).
        """
        conn: Any = self.connection
        # A block inside another (a statement bound inside a transaction's) keeps the values
        # it saves apart from the outer block's: the outer one gives back the session's own.
        depth = getattr(conn, "_jobqueue_session_depth", 0)
        keep = "jobqueue_" if depth == 0 else f"jobqueue{depth}_"
        save = ", ".join(
            f"@{keep}{n} = @@SESSION.{n}, SESSION {n} = {v}" for n, v in values.items()
        )
        restore = "SET " + ", ".join(f"SESSION {n} = @{keep}{n}, @{keep}{n} = NULL" for n in values)
        with conn.cursor() as cursor:
            cursor.execute(f"SET {save}")
        conn._jobqueue_session_depth = depth + 1
        try:
            yield
        except BaseException:
            # Django refuses queries in a transaction that failed, until its rollback; the
            # server takes a SET there still, through the driver's own cursor.
            if conn.connection is not None:
                with suppress(conn.Database.Error):
                    raw = conn.connection.cursor()
                    try:
                        raw.execute(restore)
                    finally:
                        raw.close()
            raise
        finally:
            conn._jobqueue_session_depth = depth
        with conn.cursor() as cursor:
            cursor.execute(restore)

    def json_append(self, column: str, value: str) -> Expression:
        return Func(
            F(column),
            Value("$"),
            Value(value),
            function="JSON_ARRAY_APPEND",
            output_field=JSONField(),
        )

    def insert_jobs(self, jobs: list[Job]) -> None:
        # MariaDB (10.5+, which returns rows from an INSERT): one INSERT ... SELECT over a
        # JSON document (JSON_TABLE), instead of Django's bulk_create, whose per-field
        # preparation and the driver's escaping of every value cost about 180 µs a job.
        # MySQL returns no rows from an INSERT: the generic path, one INSERT a job.
        conn: Any = self.connection
        found = (
            self._insert_document(jobs) if conn.features.can_return_rows_from_bulk_insert else None
        )
        if found is None:
            return super().insert_jobs(jobs)
        if len(found.document) > self.document_budget() and len(jobs) > 1:
            # A statement must fit the server's max_allowed_packet: the jobs in halves (in
            # the caller's transaction still), each with a document of its own.
            half = len(jobs) // 2
            self.insert_jobs(jobs[:half])
            self.insert_jobs(jobs[half:])
            return None
        values, params, paths = [], [], ["o FOR ORDINALITY"]
        for n, field in enumerate(found.fields):
            if n in found.constants:
                values.append("%s")
                params.append(found.constants[n])
                continue
            at = found.varying.index(n)
            if isinstance(field, JSONField):  # a JSON null is SQL NULL, as the ORM stores it
                paths.append(f"c{at} JSON PATH '$[{at}]'")
                values.append(f"NULLIF(r.c{at}, 'null')")
            else:
                paths.append(f"c{at} {field.db_type(conn)} PATH '$[{at}]'")
                values.append(f"r.c{at}")
        source = f"JSON_TABLE(%s, '$[*]' COLUMNS ({', '.join(paths)})) AS r ORDER BY r.o"
        # The rows come back in no promised order; their ids rise in the order they went in.
        self._insert_selected(jobs, found, values, params, source, sort_by_id=True)

    def document_budget(self) -> int:
        """The longest JSON document (ASCII) one bulk INSERT carries: a quarter of the
        server's max_allowed_packet (the driver's escaping may double it), read once."""
        if self._budget is None:
            with self.connection.cursor() as cursor:
                cursor.execute("SELECT @@max_allowed_packet")
                self._budget = int(cursor.fetchone()[0]) // 4
        return self._budget

    def is_transient(self, exc: BaseException) -> bool:
        args: Any = getattr(exc.__cause__, "args", None) or getattr(exc, "args", ())
        return isinstance(exc, DatabaseError) and bool(args) and args[0] in _TRANSIENT_CODES
