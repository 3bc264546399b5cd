"""SQLite: no row locks, so a claim takes the database write lock up front (BEGIN IMMEDIATE);
from SQLite 3.35 the claim is one UPDATE ... RETURNING inside it."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from django.core import checks
from django.db import DatabaseError, transaction
from django.db.models import Expression, F, Func, JSONField, QuerySet, Value
from django.db.models.expressions import RawSQL

from ..models import Job, JobQuerySet
from .base import Dialect

if TYPE_CHECKING:
    from ..lease_results import ClaimedJob

M = TypeVar("M", bound=Any)

# Primary result codes of a lock conflict: SQLITE_BUSY, SQLITE_LOCKED.
_BUSY_CODES = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED}


class SQLiteDialect(Dialect):
    vendor = "sqlite"
    has_select_for_update_skip_locked = False
    claim_strategy = "BEGIN IMMEDIATE (database write lock, busy retry with backoff)"
    transient_retries = 12
    can_return_rows_from_update = sqlite3.sqlite_version_info >= (3, 35)

    def lock(self, queryset: QuerySet[M]) -> QuerySet[M]:
        # select_for_update() is silently ignored on SQLite; the claim is safe only because
        # the transaction took the write lock at BEGIN IMMEDIATE, before reading.
        return queryset

    def lock_blocking(self, queryset: QuerySet[M]) -> QuerySet[M]:
        return queryset

    blocking_lock_sql = ""  # BEGIN IMMEDIATE made this transaction the only writer
    skip_locked_sql = ""

    def merged_group_reads_sql(
        self, query: QuerySet[Any], reads: Sequence[tuple[str, int]], compiled: dict[Any, Any]
    ) -> tuple[str, list[Any]] | None:
        # One statement over a JSON document of the reads: each read's ids come from a
        # correlated IN of the group's best jobs, one statement text for any number of reads
        # (ten reads: 74 µs against 256 µs for a UNION ALL of ten). SQLite's LIMIT cannot
        # name the outer row, so each read takes the largest count and the caller keeps its
        # own: rows are not locked here (BEGIN IMMEDIATE took the database's write lock).
        most = max(count for _, count in reads)
        key = ("json_each", most)
        if key not in compiled:
            group = RawSQL("json_extract(jq_r.value, '$[0]')", ())
            best = query.filter(group_key=group).values_list("pk")[:most]
            ids, params = self.compile_query(best)
            fields = query._fields  # type: ignore[attr-defined]
            columns = ", ".join(f"jq_j.{self.qn(_column(name))}" for name in fields)
            table = self.qn(Job._meta.db_table)
            compiled[key] = (
                f"SELECT jq_r.key, {columns} FROM json_each(%s) AS jq_r"
                f" JOIN {table} AS jq_j ON jq_j.{self.qn(_column('pk'))} IN ({ids})",
                params,
            )
        sql, params = compiled[key]
        return sql, [json.dumps([[group, count] for group, count in reads]), *params]

    @contextmanager
    def _atomic(self) -> Iterator[None]:
        # A deferred transaction that reads and then writes fails with SQLITE_BUSY when another
        # connection wrote in between; BEGIN IMMEDIATE reserves the write lock before the read.
        conn: Any = self.connection
        if conn.in_atomic_block:
            raise RuntimeError("Worker transactions must not run inside another transaction.")
        # Connect first: Django sets `transaction_mode` from OPTIONS while connecting, so on a
        # thread's fresh (or closed) connection the attribute is missing, or would be reset to
        # the configured mode (DEFERRED by default) by the connect that atomic() performs.
        conn.ensure_connection()
        previous = conn.transaction_mode
        conn.transaction_mode = "IMMEDIATE"
        try:
            with transaction.atomic(using=self.using):
                yield
        finally:
            conn.transaction_mode = previous

    def is_transient(self, exc: BaseException) -> bool:
        cause = exc.__cause__
        if not isinstance(exc, DatabaseError) or not isinstance(cause, sqlite3.Error):
            return False
        code = getattr(cause, "sqlite_errorcode", None)
        return code is not None and (code & 0xFF) in _BUSY_CODES

    def journal_mode(self) -> str:
        """Return the database's journal mode (``wal`` is what concurrent workers want)."""
        with self.connection.cursor() as cursor:
            cursor.execute("PRAGMA journal_mode")
            return str(cursor.fetchone()[0]).lower()

    def system_checks(self) -> list[checks.CheckMessage]:
        # Without WAL, readers and the writer block each other; a DEFERRED transaction that
        # reads and then writes fails with SQLITE_BUSY when another connection wrote between.
        connection: Any = self.connection
        warnings: list[checks.CheckMessage] = []
        if connection.is_in_memory_db():
            return warnings
        if self.journal_mode() != "wal":
            warnings.append(
                checks.Warning(
                    f"SQLite database {self.using!r} is not in WAL mode: workers and your app "
                    "will block each other's reads.",
                    hint="Add 'init_command': 'PRAGMA journal_mode=WAL;' to its OPTIONS.",
                    id="django_jobqueue.W001",
                )
            )
        mode = connection.settings_dict.get("OPTIONS", {}).get("transaction_mode") or ""
        if mode.upper() != "IMMEDIATE":
            warnings.append(
                checks.Warning(
                    f"SQLite database {self.using!r} starts transactions DEFERRED: a "
                    "transaction that reads and then enqueues can fail with 'database is "
                    "locked' under load.",
                    hint="Add 'transaction_mode': 'IMMEDIATE' to its OPTIONS.",
                    id="django_jobqueue.W002",
                )
            )
        return warnings

    def _bound_waits(self, lock_timeout: float, idle_timeout: float | None) -> None:
        # The busy timeout bounds the wait for the write lock (BEGIN IMMEDIATE).
        with self.connection.cursor() as cursor:
            cursor.execute(f"PRAGMA busy_timeout = {max(1, int(lock_timeout * 1000))}")

    def id_set(self, ids: Sequence[int]) -> Any:
        # One JSON parameter instead of an IN list of parameters (SQLite caps their number).
        return RawSQL("SELECT value FROM json_each(%s)", (json.dumps(list(ids)),))

    def insert_jobs(self, jobs: list[Job]) -> None:
        # One INSERT ... SELECT over a JSON document (json_each), instead of Django's
        # bulk_create, whose per-field preparation of every row was most of enqueue_many()'s
        # time. RETURNING needs SQLite 3.35.
        found = self._insert_document(jobs) if self.can_return_rows_from_update else None
        if found is None:
            return super().insert_jobs(jobs)
        values, params = [], []
        for n in range(len(found.fields)):
            if n in found.constants:
                values.append("%s")
                params.append(found.constants[n])
            else:
                values.append(f"json_extract(value, '$[{found.varying.index(n)}]')")
        self._insert_selected(jobs, found, values, params, "json_each(%s) ORDER BY key")

    def json_append_sql(self, column: str) -> str:
        return f"json_insert({column}, '$[#]', %s)"

    def json_append(self, column: str, value: str) -> Expression:
        return Func(
            F(column), Value("$[#]"), Value(value), function="json_insert", output_field=JSONField()
        )

    def claim_ready(
        self,
        ready: JobQuerySet,
        *,
        owner: str,
        limit: int,
        lease_ttl: float,
        shape: Any = None,
    ) -> list[ClaimedJob]:
        if not self.can_return_rows_from_update:
            return super().claim_ready(
                ready, owner=owner, limit=limit, lease_ttl=lease_ttl, shape=shape
            )
        inner, params = self.compile_claim(ready, limit, shape)
        return self._update_returning(f"id IN ({inner})", params, owner, lease_ttl)

    def mark_claimed(
        self, ids: list[int], *, owner: str, lease_ttl: float, last: bool = False
    ) -> list[ClaimedJob]:
        if not self.can_return_rows_from_update or not ids:
            return super().mark_claimed(ids, owner=owner, lease_ttl=lease_ttl)
        order = {pk: n for n, pk in enumerate(ids)}
        marks = ", ".join(["%s"] * len(ids))
        claimed = self._update_returning(f"id IN ({marks})", ids, owner, lease_ttl)
        claimed.sort(key=lambda r: order[r.id])
        return claimed

    def _update_returning(
        self, where: str, params: list[Any], owner: str, lease_ttl: float
    ) -> list[ClaimedJob]:
        # One statement: the write lock is already held (BEGIN IMMEDIATE), so no other claim
        # can read these rows between the choice and the update.
        sets, set_params = self.claim_sets(owner, lease_ttl)
        table = self.qn(Job._meta.db_table)
        sql = f"UPDATE {table} SET {sets} WHERE {where} RETURNING {self.claim_columns()}"
        with self.connection.cursor() as cursor:
            cursor.execute(sql, [*set_params, *params])
            rows = self.load_claimed(cursor.fetchall())
        for row in rows:
            # RETURNING hands back a REAL column's integral value as stored (an int).
            if row.timeout is not None:
                row.timeout = float(row.timeout)
        rows.sort(key=lambda r: (-r.priority, r.id))
        return rows


def _column(name: str) -> str:
    """The job table's column of the field `name` of a `values_list` ("pk": the key's)."""
    field = Job._meta.pk if name == "pk" else Job._meta.get_field(name)
    return str(getattr(field, "column", None) or name)
