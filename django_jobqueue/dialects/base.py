"""Shared transaction, locking and hot-path logic, and the capability flags dialects override.

The claim and the batched finish are the worker's hot path. The portable versions here use
the ORM (a locking read, then an UPDATE by ids: two statements); a dialect whose database can
return rows from an UPDATE overrides them with one raw statement, built from the ORM's own
compiled SQL for the portable parts (the ready filter, the database clock).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import logging
import operator
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any, NamedTuple, TypeVar

from django.core import checks
from django.db import DatabaseError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import (
    Case,
    Count,
    DateTimeField,
    Exists,
    Expression,
    F,
    Field,
    JSONField,
    OuterRef,
    Q,
    QuerySet,
    TextField,
    Value,
    When,
)
from django.db.models.functions import Coalesce
from django.db.models.sql import Query
from django.utils import timezone

from .. import registry, versions
from ..models import (
    READY_QUEUE_INDEX,
    Job,
    JobDependency,
    JobQuerySet,
    JobSequence,
    JobStep,
    JobWait,
    Limit,
)
from ..models.fields import key_collation
from ..models.functions import DbNow
from ..records import CLAIM_FIELDS, ClaimedJob, Finished, FinishReport

logger = logging.getLogger(__name__)
ARGS = CLAIM_FIELDS.index("args")


@dataclasses.dataclass
class JobDocument:
    """New jobs' columns for one INSERT: the values all rows share, and the rest as JSON."""

    fields: list[Any]  # the columns written, in order (all but id, created_at, updated_at)
    constants: dict[int, Any]  # field index -> the value every row has (JSON as JSON text)
    varying: list[int]  # field indexes whose values the document holds, in this order
    document: str  # a JSON list of rows, each the values of `varying`
    count: int


T = TypeVar("T")
M = TypeVar("M", bound=Any)

MAX_DELAY = 10 * 365 * 24 * 3600.0  # seconds: any longer delay is cut to ten years


def seconds(value: float) -> dt.timedelta:
    """Return `value` seconds as a timedelta, clamped to [0, ten years]."""
    return dt.timedelta(seconds=min(max(0.0, value), MAX_DELAY))


class TransientDatabaseError(DatabaseError):
    """A write transaction kept failing on lock contention after bounded retries."""


def statement_bound(lock_timeout: float, idle_timeout: float) -> float:
    """How long a statement of a worker transaction may run: as long as the transaction may
    sit idle (the lease TTL), and never less than twice its lock wait bound, so that a wait
    for a lock still ends as a lock timeout (a transient error, retried at once)."""
    return max(idle_timeout, 2 * lock_timeout)


class LockedResources(NamedTuple):
    """The `Limit` rows a claim locked: each one's (name, closed_until), the database's time at
    the lock, and the `uses` of the jobs in flight that use them (read after the lock)."""

    rows: list[tuple[str, dt.datetime | None]]
    now: dt.datetime
    uses: list[dict[str, int]]


# What a new job's JSON columns may hold to travel inside `_insert_document`'s document.
_JSON_DOCUMENT_TYPES = {dict, list, type(None)}


def result_of(cursor: Any) -> Any:
    """The rows of the statement `cursor` ran last, or the count of the rows it wrote."""
    return cursor.fetchall() if cursor.description is not None else cursor.rowcount


class GrantWrite(NamedTuple):
    """What `Dialect.grant_sql` grants and writes: `units` of `resource` under `cap` (the
    window's statement `read`), the record (name, seq, place) fenced by `lease` (job id, owner,
    attempt), and the spend of `handler`."""

    resource: str
    units: int
    cap: int
    read: tuple[str, list[Any]]
    record: tuple[str, int, int | None]
    lease: tuple[int, str, int]
    handler: str


class Dialect:
    """How one database claims, locks and retries; subclasses override only what differs."""

    vendor = "unknown"
    # Whether SELECT ... FOR UPDATE SKIP LOCKED gives row-level claims.
    has_select_for_update_skip_locked = True
    # Whether UPDATE ... RETURNING exists: the claim and the finish are then one statement.
    can_return_rows_from_update = False
    # Whether a running job's grant (its clock, window read, record and rows) is one statement
    # (`grant_sql`): data-modifying WITH clauses.
    can_grant_in_one_statement = False
    # Whether a running job's deferred records (settlements that give back) may be written in
    # its next grant's transaction, beside the grant's own spend row (`budgets._grant`).
    can_defer_into_grant = True
    # Whether the database can push a wake-up to idle workers (LISTEN/NOTIFY).
    supports_listen_notify = False
    # Whether maintain() has upkeep to do (the worker runs its maintainer duty then).
    maintains_tables = False
    # Whether an index answers `args @> {...}` (the admin's argument search adds that test).
    indexes_json_containment = False
    # Human-readable name of the claim strategy, for the worker's start-up line.
    claim_strategy = "SELECT ... FOR UPDATE SKIP LOCKED"
    # Attempts of a write transaction that hits lock contention, and its backoff.
    transient_retries = 8
    transient_backoff = 0.01

    def __init__(self, using: str) -> None:
        self.using = using
        self._sql_cache: dict[Any, tuple[str, list[Any]]] = {}
        self._loaders: dict[Any, list[Any]] = {}

    @property
    def connection(self) -> BaseDatabaseWrapper:
        """The current thread's connection for this alias."""
        return connections[self.using]

    def check_server(self) -> None:
        """Raise UnsupportedDatabaseError if this server cannot run the queue."""

    def system_checks(self) -> list[checks.CheckMessage]:
        """Return the system check messages about this database's server and settings."""
        return []

    def key_collation(self) -> str | None:
        """Return the collation under which key columns compare exactly, or None for the default.

        PostgreSQL's and SQLite's default comparisons are already exact (byte for byte).
        """
        return key_collation(self.connection)

    def describe(self) -> str:
        """Return 'flavour version' of the server, for logs."""
        conn = self.connection
        conn.ensure_connection()
        return f"{conn.display_name} {'.'.join(map(str, conn.get_database_version()))}"

    def now(self) -> dt.datetime:
        """Return the database server's current time (aware, UTC), read at this instant."""
        sql, params = self.clock_sql()
        with self.connection.cursor() as cursor:
            cursor.execute(f"SELECT {sql}", params)
            return aware(cursor.fetchone()[0])

    def clock_sql(self) -> tuple[str, list[Any]]:
        """The SQL of the server's clock at the moment a statement runs."""
        return self.compile(DbNow())

    # -- the resources of every limit (limits/resources.py) ----------------------------------
    # Raw statements: a claim under LIMITS runs both, and the ORM took four times as long as
    # the database to build them.

    # How a SELECT waits for and locks its rows (none on SQLite: its writers take turns).
    blocking_lock_sql = " FOR UPDATE"
    # How a SELECT locks the rows it can lock at once, passing over those another transaction
    # holds (none on SQLite, as above).
    skip_locked_sql = " FOR UPDATE SKIP LOCKED"

    def lock_resources(self, names: Sequence[str], capped: Sequence[str] = ()) -> LockedResources:
        """Lock the existing `Limit` rows of `names` that no other transaction holds, without
        waiting; then read the `uses` of the jobs in flight that use any resource of `capped`.

        Return each row locked (name, closed_until), the database's time at the lock, and
        those `uses`: a name missing from the rows has no row yet, or another transaction
        holds it. The jobs in flight are read by a statement of its own, after the lock: at
        READ COMMITTED it sees what the claims that held those rows before committed.
        """
        statements = [self.lock_resources_sql(names)]
        if capped:
            statements.append(self.uses_in_flight_sql(capped))
        results = self.execute_together(statements)
        rows, uses = results[0], results[1] if capped else []
        now = aware(rows[0][2]) if rows else self.now()
        locked = [(name, aware(until) if until else None) for name, until, _ in rows]
        return LockedResources(locked, now, [read_json(u) for (u,) in uses])

    def execute_together(
        self, statements: list[tuple[str, list[Any]]], *, last: bool = False
    ) -> list[Any]:
        """Run `statements` (SQL, parameters) in order, each with its own snapshot, and return
        each one's rows (a write's: its row count). Here one after the other; a dialect may
        send them in one round trip, and with `last` (nothing follows in the transaction but
        reads) its COMMIT too."""
        results = []
        with self.cursor() as cursor:
            for sql, params in statements:
                cursor.execute(sql, params)
                results.append(result_of(cursor))
        return results

    def lock_resources_sql(
        self, names: Sequence[str], *, wait: bool = False
    ) -> tuple[str, list[Any]]:
        """The statement of `lock_resources` that locks the rows (and reads the clock); with
        `wait`, one that waits for their holders (a running job's grant of one resource)."""
        clock, params = self.clock_sql()
        named, names_params = self.in_sql("name", names)
        lock = self.blocking_lock_sql if wait else self.skip_locked_sql
        sql = (
            f"SELECT name, closed_until, {clock} FROM {self.qn(Limit._meta.db_table)} "
            f"WHERE {named} ORDER BY name{lock}"
        )
        return sql, [*params, *names_params]

    def grant_sql(self, grant: GrantWrite) -> tuple[str, list[Any]]:
        """The one statement of a running job's grant, after the lock of its resource's row
        (`can_grant_in_one_statement`): read the clock and the window (`grant.read`); if the
        row is there and the window has room for `grant.units` under `grant.cap`, write the
        grant's record (`grant.record`: name, seq, place; fenced by `grant.lease`, locking the
        job's row) and its window and spend rows, stamped with that clock. Its one row:
        (clock, closed_until, units in the window, their oldest start, records written)."""
        raise NotImplementedError

    def existing_resources(self, names: Sequence[str]) -> set[str]:
        """The names of `names` that have a `Limit` row, read without a lock (nor a wait)."""
        named, params = self.in_sql("name", names)
        with self.cursor() as cursor:
            cursor.execute(
                f"SELECT name FROM {self.qn(Limit._meta.db_table)} WHERE {named}", params
            )
            return {name for (name,) in cursor.fetchall()}

    def conflict_target(self, fields: Sequence[str]) -> list[str] | None:
        """`unique_fields` for an upsert (`bulk_create(update_conflicts=True)`) on the unique
        `fields`: them, or None where the database's upsert names no conflict target (MySQL's
        ON DUPLICATE KEY UPDATE, which any unique key triggers)."""
        return (
            list(fields) if self.connection.features.supports_update_conflicts_with_target else None
        )

    def add_to_minutes(
        self,
        model: type[Any],
        keys: Sequence[str],
        value: str,
        rows: Sequence[tuple[Sequence[Any], int]],
    ) -> None:
        """Add each row's number to column `value` of the row of `model` with its `keys`
        values, made if missing: one upsert (INSERT ... ON CONFLICT DO UPDATE) for all."""
        if not rows:
            return
        table = self.qn(model._meta.db_table)
        fields = {f.name: f for f in model._meta.concrete_fields}
        columns = [*keys, value]
        marks = ", ".join(["(" + ", ".join(["%s"] * len(columns)) + ")"] * len(rows))
        params = [
            fields[name].get_db_prep_save(v, self.connection)
            for key, n in rows
            for name, v in zip(columns, [*key, n], strict=True)
        ]
        names = ", ".join(self.qn(c) for c in columns)
        sql = f"INSERT INTO {table} ({names}) VALUES {marks} " + self._add_on_conflict(
            table, keys, value
        )
        with self.cursor() as cursor:
            cursor.execute(sql, params)

    def _add_on_conflict(self, table: str, keys: Sequence[str], value: str) -> str:
        """The clause of `add_to_minutes` that adds to the row already there."""
        column = self.qn(value)
        target = ", ".join(self.qn(k) for k in keys)
        return (
            f"ON CONFLICT ({target}) DO UPDATE SET {column} = {table}.{column} + EXCLUDED.{column}"
        )

    # -- sequences (sequences.py) ------------------------------------------------------------

    def lock_sequences(self, keys: Sequence[str]) -> dict[str, int | None]:
        """Lock the rows of sequences `keys` (sorted) until the transaction ends, making the
        missing ones; return {key: head}.

        One upsert: an existing row is locked by its no-op update (its waiters queue on
        the row, never on a lock taken to read, so no two upgrade a shared lock into a
        deadlock), a row another transaction is inserting or deleting is waited for, and the
        rows come back with RETURNING where it exists.
        """
        table, key = self.qn(JobSequence._meta.db_table), self.qn("key")
        now = self.connection.ops.adapt_datetimefield_value(timezone.now())
        marks = ", ".join(["(%s, NULL, %s, %s)"] * len(keys))
        sql = (
            f"INSERT INTO {table} ({key}, head, created_at, updated_at) VALUES {marks} "
            + self._touch_on_conflict(key)
        )
        params = [value for name in keys for value in (name, now, now)]
        with self.cursor() as cursor:
            if self.can_return_rows_from_update:
                cursor.execute(f"{sql} RETURNING {key}, head", params)
                return dict(cursor.fetchall())
            cursor.execute(sql, params)
            where, params = self.in_sql(key, keys)
            cursor.execute(
                f"SELECT {key}, head FROM {table} WHERE {where}{self.blocking_lock_sql}", params
            )
            return dict(cursor.fetchall())

    def _touch_on_conflict(self, key: str) -> str:
        """The clause of `lock_sequences` that updates (so locks) the row already there."""
        return f"ON CONFLICT ({key}) DO UPDATE SET updated_at = EXCLUDED.updated_at"

    def in_sql(self, column: str, values: Sequence[str]) -> tuple[str, list[Any]]:
        """SQL true for a row whose `column` is one of `values`: an IN list here."""
        return f"{column} IN ({', '.join(['%s'] * len(values))})", [*values]

    def uses_in_flight_sql(self, names: Sequence[str]) -> tuple[str, list[Any]]:
        """The `uses` of the leased and running jobs that use any resource of `names`."""
        sql, params = self.uses_any_sql(names)
        table = self.qn(Job._meta.db_table)
        return f"SELECT uses FROM {table} WHERE lease_expires IS NOT NULL AND {sql}", params

    def uses_any_sql(self, names: Sequence[str]) -> tuple[str, list[Any]]:
        """SQL true for a job whose `uses` names one of `names`."""
        marks = ", ".join(["%s"] * len(names))
        return f"EXISTS (SELECT 1 FROM json_each(uses) AS e WHERE e.key IN ({marks}))", [*names]

    # -- the records of durable calls (durable.py) -------------------------------------------

    def read_records(self, ids: list[int], limit: int) -> list[tuple[Any, ...]]:
        """The first `limit` records of the jobs `ids` (ascending), in job order: (job id,
        name, seq, result as the database returns it: see `read_json`, place).

        Its statement is compiled by the ORM once per number of ids and kept: a claim reads the
        records of each batch of resumed jobs, and compiling it each time cost more than its run.
        """
        key = ("read_records", len(ids), limit)
        if key not in self._sql_cache:
            query = (
                JobStep.objects.using(self.using)
                .filter(job_id__in=ids)
                .order_by("job_id")
                .values_list("job_id", "name", "seq", "result", "place")[:limit]
            )
            sql, params = self.compile_query(query)
            assert params == ids, "the ids must be the statement's only parameters"
            self._sql_cache[key] = (sql, [])
        sql, _ = self._sql_cache[key]
        return self._fetch_records(sql, ids)

    def _fetch_records(self, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return list(cursor.fetchall())

    def record_call_sql(
        self, *, job_id: int, owner: str, attempt: int, name: str, seq: int, result: Any,
        duration: float | None, place: int | None = None,
    ) -> tuple[str, list[Any]]:  # fmt: skip
        """`record_call`'s statement (without the mark), to run with others (`write_together`):
        it inserts one row while the lease is current, and locks the job's row."""
        values = self._record_values(name, seq, place, result, attempt, duration)
        return self._record_call_sql, [*values, job_id, owner, attempt]

    def fenced_insert_sql(
        self,
        model: type[Any],
        row: dict[str, Any],
        lease: tuple[int, str, int],
        *,
        add_to: tuple[Sequence[str], str] | None = None,
    ) -> tuple[str, list[Any]]:
        """An INSERT of one row of `model` ({field: value}) that writes it only while `lease`
        (job id, owner, attempt) is current; with `add_to` ((key fields, value field)), one
        that adds its value to the row of the same keys, made if missing (as
        `add_to_minutes`). It goes after `record_call_sql` in a `write_together`, which locked
        the job's row: then the row is written with the record, or neither."""
        fields = {f.name: f for f in model._meta.concrete_fields}
        names = ", ".join(self.qn(fields[name].column) for name in row)
        marks = ", ".join(["%s"] * len(row))
        params = [fields[name].get_db_prep_save(v, self.connection) for name, v in row.items()]
        job = self.qn(Job._meta.db_table)
        states = ", ".join(f"'{state}'" for state in Job.LEASED_STATES)
        sql = (
            f"INSERT INTO {self.qn(model._meta.db_table)} ({names}) SELECT {marks} FROM {job} j "
            f"WHERE j.id = %s AND j.lease_owner = %s AND j.attempts = %s AND j.state IN ({states})"
        )
        if add_to is not None:
            sql += " " + self._add_on_conflict(self.qn(model._meta.db_table), *add_to)
        return sql, [*params, *lease]

    def write_together(
        self, statements: Sequence[tuple[str, list[Any]]], *, last: bool = False
    ) -> list[int]:
        """Run the writes `statements` (SQL, parameters) in order in the caller's transaction,
        and return each one's row count. Here one after the other; a dialect may send them in
        one round trip, and with `last` (nothing follows in the transaction) its COMMIT too."""
        counts = []
        with self.cursor() as cursor:
            for sql, params in statements:
                cursor.execute(sql, params)
                counts.append(cursor.rowcount)
        return counts

    def write_alone(self, statements: Sequence[tuple[str, list[Any]]]) -> list[int]:
        """`write_together` in a write transaction of its own (a savepoint of the caller's
        open one): all of `statements` are written, or none."""
        with self.step_transaction():
            return self.write_together(statements, last=True)

    def record_call(
        self,
        *,
        job_id: int,
        owner: str,
        attempt: int,
        name: str,
        seq: int,
        result: Any,
        duration: float | None,
        place: int | None = None,
        mark: bool = False,
    ) -> bool:
        """Insert the record of a durable call while the lease (owner, attempt) is current,
        locking the job's row until the caller's transaction ends; False (nothing written)
        when the lease is gone. With `mark` (the job's first record), say so on its row
        (`has_steps`, which the claim reads).

        One statement, the fence and the insert together (INSERT ... SELECT ... FOR UPDATE):
        a step's record was a locking read, then an INSERT, each built by the ORM, which
        made a step cost twice an `enqueue()`. The mark is a second one, in the caller's
        transaction.
        """
        sql, params = self.record_call_sql(job_id=job_id, owner=owner, attempt=attempt, name=name,
                                           seq=seq, result=result, duration=duration,
                                           place=place)  # fmt: skip
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            recorded = bool(cursor.rowcount)
        if recorded and mark:
            Job.objects.using(self.using).filter(pk=job_id).update(has_steps=True)
        return recorded

    def _record_values(
        self,
        name: str,
        seq: int,
        place: int | None,
        result: Any,
        attempt: int,
        duration: float | None,
    ) -> list[Any]:
        """The values of a JobStep row's columns, in `_record_call_sql`'s order."""
        fields = {f.name: f for f in JobStep._meta.concrete_fields}
        return [
            fields["name"].get_db_prep_save(name, self.connection),
            seq,
            place,
            fields["result"].get_db_prep_save(result, self.connection),
            attempt,
            duration,
            fields["created_at"].get_db_prep_save(timezone.now(), self.connection),
        ]

    def record_calls(self, items: Sequence[tuple[Any, ...]]) -> set[int]:
        """Insert the records of several jobs' durable calls (one a job), as `record_call`
        would each, in the caller's transaction; return the ids of the jobs recorded.

        Each item is (job id, lease owner, attempt, name, seq, place, result, duration, mark).
        """
        recorded = set()
        by_job = sorted(items, key=operator.itemgetter(0))  # rows locked in id order
        for job_id, owner, attempt, name, seq, place, result, duration, mark in by_job:
            if self.record_call(job_id=job_id, owner=owner, attempt=attempt, name=name, seq=seq,
                                place=place, result=result, duration=duration,
                                mark=mark):  # fmt: skip
                recorded.add(job_id)
        return recorded

    def record_transaction(self) -> Any:
        """The transaction that a record written alone (`record_call`, with no other write)
        commits in: by default step_transaction()'s."""
        return self.step_transaction()

    @functools.cached_property
    def _record_call_sql(self) -> str:
        step, job = self.qn(JobStep._meta.db_table), self.qn(Job._meta.db_table)
        states = ", ".join(f"'{state}'" for state in Job.LEASED_STATES)
        return (
            f"INSERT INTO {step} (job_id, name, seq, place, result, attempt, duration, "
            f"created_at) SELECT j.id, %s, %s, %s, %s, %s, %s, %s FROM {job} j WHERE j.id = %s "
            f"AND j.lease_owner = %s AND j.attempts = %s AND j.state IN ({states})"
            f"{self.blocking_lock_sql}"
        )

    # -- locks and transactions ------------------------------------------------------------

    def lock(self, queryset: QuerySet[M]) -> QuerySet[M]:
        """Return `queryset` with the row locks a claim needs."""
        return queryset.select_for_update(skip_locked=True)

    def lock_blocking(self, queryset: QuerySet[M]) -> QuerySet[M]:
        """Return `queryset` locking its rows, waiting for other holders."""
        return queryset.select_for_update()

    def begin(self) -> None:
        """Prepare the connection for a write transaction; called inside atomic()."""

    def is_transient(self, exc: BaseException) -> bool:
        """Whether `exc` is lock contention that a retry of the whole transaction may cure."""
        return False

    def bound_waits(self, lock_timeout: float, idle_timeout: float | None = None) -> None:
        """Bound every lock wait of this thread's worker transactions to `lock_timeout` seconds.

        For the worker's own threads (their connections never run a handler's queries): a
        statement that would wait longer for a row lock, or for SQLite's write lock, fails
        with a transient error instead. Where the server can, a transaction left idle for
        `idle_timeout` seconds is ended by the server: a worker process frozen in the middle
        of one (SIGSTOP, a paused VM) then holds no row lock for longer than that.

        Each transaction of run_in_transaction() on this thread sets the bounds for itself
        (transaction_waits()), so that none outlives it on a server connection that a pooler
        hands to other clients. A bound that belongs to the connection itself, where no pooler
        can come between (SQLite's busy timeout), is set once per underlying connection.
        """
        conn: Any = self.connection
        conn._jobqueue_waits = (lock_timeout, idle_timeout)
        conn.ensure_connection()
        key = (id(conn.connection), lock_timeout, idle_timeout)
        if getattr(conn, "_jobqueue_bound_waits", None) != key:
            self._bound_waits(lock_timeout, idle_timeout)
            conn._jobqueue_bound_waits = key

    def _bound_waits(self, lock_timeout: float, idle_timeout: float | None) -> None:
        """Set the connection's own lock wait bound, where it has one (SQLite)."""

    @contextmanager
    def transaction_waits(self, lock_timeout: float, idle_timeout: float | None) -> Iterator[None]:
        """Bound the lock waits, and the idle time, of the transaction this block runs in.

        Entered at the start of the transaction; whatever it sets ends with the transaction.
        Here: nothing (see _bound_waits()).
        """
        yield

    @contextmanager
    def cursor(self) -> Iterator[Any]:
        """A cursor of this thread's connection for one statement (or a query of several).

        Inside run_in_transaction() the transaction's statements sent through here share one
        cursor (each new Django cursor cost about 25 µs of Python, a tenth of a statement on
        the claim's path); elsewhere each gets its own, closed after.
        """
        conn = self.connection
        shared = conn.__dict__.get("_jobqueue_cursor")
        if shared is None:
            with conn.cursor() as cursor:
                yield cursor
            return
        if shared is _LAZY:
            shared = conn.__dict__["_jobqueue_cursor"] = conn.cursor()
        yield shared

    @contextmanager
    def _shared_cursor(self) -> Iterator[None]:
        """The transaction's cursor for cursor(), made at its first use, closed at the end."""
        conn: Any = self.connection
        conn.__dict__["_jobqueue_cursor"] = _LAZY
        try:
            yield
        finally:
            shared = conn.__dict__.pop("_jobqueue_cursor", None)
            if shared is not None and shared is not _LAZY:
                # As Django's own cursors close: an error here (a connection gone) must not
                # take the place of the transaction's own, which decides whether to retry.
                with suppress(conn.Database.Error):
                    shared.close()

    @contextmanager
    def _worker_waits(self) -> Iterator[None]:
        waits = getattr(self.connection, "_jobqueue_waits", None)
        if waits is None:  # not a worker's thread: the project's own settings apply
            yield
            return
        with self.transaction_waits(*waits):
            yield

    @contextmanager
    def statement_timeout(self, timeout: float) -> Iterator[None]:
        """Bound each statement run inside this block to `timeout` seconds, where the server can.

        Used inside one of the worker's transactions: a statement that runs longer fails (it
        is not retried), so the transaction holds its locks, and PostgreSQL's xmin horizon,
        no longer than that. Here: no bound (SQLite's busy timeout bounds its lock waits).
        """
        yield

    def run_in_transaction(self, func: Callable[[], T], *, tries: int | None = None) -> T:
        """Run `func` in one write transaction, retrying it whole on transient lock errors.

        `func` must only touch this database: it may run more than once.
        """
        delay = self.transient_backoff
        tries = tries or self.transient_retries
        for attempt in range(1, tries + 1):
            try:
                with self._atomic():
                    self.begin()
                    with self._worker_waits(), self._shared_cursor():
                        return func()
            except DatabaseError as exc:
                if not self.is_transient(exc):
                    raise
                if attempt == tries:
                    raise TransientDatabaseError(
                        f"gave up after {attempt} attempts on lock contention: {exc}"
                    ) from exc
                logger.debug("Transient database error (attempt %s): %s", attempt, exc)
                time.sleep(delay * random.uniform(0.5, 1.5))
                delay = min(delay * 2, 1.0)
        raise AssertionError("unreachable")

    def run_in_caller_transaction(self, func: Callable[[], T]) -> T:
        """Run `func` in a savepoint of the caller's open transaction, else as run_in_transaction.

        The savepoint keeps the caller's transaction usable when `func` raises. In its own
        transaction `func` is retried whole on deadlocks and busy errors (workers lock the same
        rows in other orders), and on SQLite it starts with BEGIN IMMEDIATE.
        """
        if self.connection.in_atomic_block:
            with transaction.atomic(using=self.using):
                return func()
        return self.run_in_transaction(func)

    @property
    def autocommit_statements(self) -> bool:
        """Whether the claim (without planning) and the finish of simple jobs may run as
        single statements in autocommit, saving a transaction's BEGIN and COMMIT trips."""
        return False

    def run_statement(self, func: Callable[[], T]) -> T:
        """Run `func`, one statement in autocommit, retrying it on transient lock errors.

        No bound of bound_waits() applies: a setting that ended with the statement would cost
        a transaction (BEGIN, SET LOCAL, COMMIT), and one that did not would stay on a pooled
        server connection. The worker runs here only statements that lock rows with SKIP
        LOCKED, which never wait for a row lock, and no transaction of theirs is left idle.
        """
        delay = self.transient_backoff
        for attempt in range(1, self.transient_retries + 1):
            try:
                if self.connection.in_atomic_block:
                    raise RuntimeError("Worker statements must not run inside a transaction.")
                return func()
            except DatabaseError as exc:
                if not self.is_transient(exc) or attempt == self.transient_retries:
                    raise
                time.sleep(delay * random.uniform(0.5, 1.5))
                delay = min(delay * 2, 1.0)
        raise AssertionError("unreachable")

    def finish_simple(
        self, *, owner: str, items: Sequence[tuple[int, int, str | None]]
    ) -> list[Finished]:
        """Finish, in one autocommit statement, the jobs of `items` that need nothing else.

        Only where `autocommit_statements`; see PostgreSQLDialect.
        """
        raise NotImplementedError

    def suspend_sleeps(self, items: Sequence[tuple[int, str, int, float, list[Any]]]) -> list[int]:
        """Suspend, in one autocommit statement, the sleeping jobs of `items` that need
        nothing else; return the ids of those it suspended (now `scheduled`).

        Each item is (job id, lease owner, attempt, delay in seconds, records). Only where
        `autocommit_statements`; see PostgreSQLDialect.
        """
        raise NotImplementedError

    def promote_due(self, batch: int) -> dict[str, int]:
        """Make up to `batch` due scheduled jobs `ready` (earliest first), in one autocommit
        statement that also wakes the other processes' workers; return {queue: how many}.

        Only where `autocommit_statements`; see PostgreSQLDialect.
        """
        raise NotImplementedError

    def _atomic(self) -> Any:
        if self.connection.in_atomic_block:
            raise RuntimeError("Worker transactions must not run inside another transaction.")
        return transaction.atomic(using=self.using)

    def step_transaction(self) -> Any:
        """The transaction a durable step's function and its record commit in together: a
        write transaction of its own, or a savepoint of the handler's open one."""
        if self.connection.in_atomic_block:
            return transaction.atomic(using=self.using)
        return self._atomic()

    # -- wake-up -----------------------------------------------------------------------------

    def notify(self, queues: Iterable[str]) -> None:
        """Tell workers in other processes that `queues` have ready work, on commit."""

    def create_notify_trigger(self, schema_editor: Any, table: str) -> None:
        """Create whatever makes an INSERT of ready jobs wake workers (a migration step)."""

    def drop_notify_trigger(self, schema_editor: Any, table: str) -> None:
        """Undo create_notify_trigger()."""

    # -- maintenance -------------------------------------------------------------------------

    def storage_tuning(self) -> list[str]:
        """Statements that tune the queue tables' storage for their churn (none by default)."""
        return []

    def name_session(self, name: str) -> None:
        """Give this thread's (just opened) connection a name the server shows its operators.

        Nothing by default: only some databases have a name a client can set.
        """

    def maintain(self, *, min_rows: int, fraction: float) -> list[str]:
        """Do the upkeep of the queue's tables that the database is not doing; return the
        statements run (none by default: the database keeps its own tables in shape).

        A table is due once `min_rows` rows, and `fraction` of its live rows, have died or
        changed since the database last did it.
        """
        return []

    # -- SQL building blocks -----------------------------------------------------------------

    def compile(self, expression: Any) -> tuple[str, list[Any]]:
        """Return the SQL and parameters of an ORM expression on this database."""
        query = Query(Job)
        compiler = query.get_compiler(using=self.using)
        sql, params = compiler.compile(expression.resolve_expression(query))
        return sql, list(params)

    def hinted_sql(self, sql: str, indexes: Sequence[str]) -> str:
        """`sql`, a SELECT of ready jobs from the job table (compiled by the ORM), reading the
        table through one of `indexes` where this database's optimizer needs telling. Here:
        as it is (the planner picks them by itself)."""
        return sql

    def read_through(self, query: QuerySet[Any], indexes: Sequence[str]) -> list[Any]:
        """The rows of `query`, a `values_list` of ready jobs, read through one of `indexes`
        (`hinted_sql`). Here: as the ORM reads them."""
        return list(query)

    def compile_query(self, queryset: QuerySet[Any]) -> tuple[str, list[Any]]:
        """Return the SQL and parameters of a SELECT queryset (inside a transaction)."""
        sql, params = queryset.query.get_compiler(using=self.using).as_sql()
        return sql, list(params)

    def compile_claim(
        self, ready: JobQuerySet, limit: int, shape: Any = None
    ) -> tuple[str, list[Any]]:
        """The SQL of the claim's choice: the ids of the best `limit` ready jobs, locked.

        With `shape` (what tells this `ready` queryset from others: the queues), it is
        compiled by the ORM once and kept: the ready filter uses the database clock in SQL,
        so the statement never changes for a given shape and limit.
        """
        key = ("claim", shape, limit)
        if shape is None or key not in self._sql_cache:
            if queues := merged_queues(shape):
                self._sql_cache[key] = self.compile_merged(ready, limit, queues, ids=True)
            else:
                self._sql_cache[key] = self.compile_locked(
                    ready.order_by("-priority", "pk").values("pk"), limit
                )
        sql, params = self._sql_cache[key]
        return sql, list(params)

    def compile_merged(
        self, ready: JobQuerySet, limit: int, queues: Sequence[str], *, ids: bool
    ) -> tuple[str, list[Any]]:
        """The SQL of the best `limit` ready jobs of several `queues`, each queue's read from
        its own index (READY_QUEUE_INDEX) and locked there, the reads merged in claim order.

        Read through the ready index, a claim of queues `a` and `b` would read the ready jobs
        of every other queue ahead of theirs. Each queue's read locks up to `limit` rows (SKIP
        LOCKED): the rows the merge leaves out stay locked until the claim's transaction ends.
        It selects the jobs' ids (`ids`), or their CLAIM_FIELDS.
        """
        fields = ("id", "priority") if ids else CLAIM_FIELDS
        columns = "u.id" if ids else self.claim_columns("u.")
        branches, params = [], []
        for n, queue in enumerate(queues):
            best = ready.filter(queue=queue).order_by("-priority", "pk").values_list(*fields)
            sql, branch_params = self.compile_locked(best, limit)
            branches.append(f"SELECT * FROM ({self.hinted_sql(sql, [READY_QUEUE_INDEX])}) AS q{n}")
            params += branch_params
        merged = " UNION ALL ".join(branches)
        sql = f"SELECT {columns} FROM ({merged}) AS u ORDER BY u.priority DESC, u.id LIMIT {limit}"
        return sql, params

    def group_reads_sql(
        self,
        query: QuerySet[Any],
        reads: Sequence[tuple[str, int]],
        indexes: Sequence[str],
        compiled: dict[Any, Any],
    ) -> list[tuple[str, list[Any]]]:
        """The statements (SQL and parameters) that lock, for each (group, count) of `reads`,
        the first `count` rows of `query` (a `values_list` of ready jobs in claim order) of
        that group, read through one of `indexes`. With several reads each row comes with the
        index of its read in `reads` first, in no set order (a dialect may return up to the
        largest count of the reads for each: the caller keeps the first `count` of each read
        in claim order); one read's rows come as they are. `compiled` keeps what is compiled
        for `query` between calls (the caller's: one per query).

        Here: each read compiled by the ORM once per count, its group a parameter, the reads
        joined by UNION ALL, up to MERGED_READS a statement and within the database's limit
        of parameters (SQLite's may be 999, and each read repeats the ready filter's).
        """
        if len(reads) > 1 and (merged := self.merged_group_reads_sql(query, reads, compiled)):
            return [merged]
        statements: list[tuple[str, list[Any]]] = []
        branches: list[str] = []
        params: list[Any] = []
        most = self.connection.features.max_query_params or 65535
        for n, (group, count) in enumerate(reads):
            if count not in compiled:
                sql, branch_params = self.compile_locked(query.filter(group_key=_MARK), count)
                compiled[count] = (self.hinted_sql(sql, indexes), branch_params)
            sql, branch_params = compiled[count]
            if branches and (
                len(branches) >= MERGED_READS or len(params) + len(branch_params) > most
            ):
                statements.append((" UNION ALL ".join(branches), params))
                branches, params = [], []
            if len(reads) > 1:
                sql = f"SELECT {n} AS jq_read, r{n}.* FROM ({sql}) AS r{n}"
            branches.append(sql)
            params += [group if p == _MARK else p for p in branch_params]
        if branches:
            statements.append((" UNION ALL ".join(branches), params))
        return statements

    def merged_group_reads_sql(
        self, query: QuerySet[Any], reads: Sequence[tuple[str, int]], compiled: dict[Any, Any]
    ) -> tuple[str, list[Any]] | None:
        """One statement of all the (several) `reads` of `group_reads_sql`, where this
        database has a better form than a UNION ALL of them; else None (here)."""
        return None

    def compile_locked(self, queryset: QuerySet[Any], limit: int) -> tuple[str, list[Any]]:
        """The SQL and parameters of the first `limit` rows of `queryset`, with the claim's
        row locks (lock()), for a raw statement."""
        locked = self.lock(queryset)[:limit]
        if self.connection.in_atomic_block:  # a claim's: no savepoint (two round trips)
            return self.compile_query(locked)
        # select_for_update() compiles only inside a transaction (even in autocommit use).
        with transaction.atomic(using=self.using):
            return self.compile_query(locked)

    def promote(self, ids: Sequence[int]) -> set[str]:
        """Make the locked waiting jobs `ids` whose upstreams are all done runnable.

        They become `ready`, or `scheduled` when their `run_after` lies ahead. An `awaits`
        edge (ctx.wait_for) needs its upstream final, not done; a job whose JobWait row has a
        `count` needs only that many of its awaited jobs final. Returns the queues of the jobs
        promoted. Portable version: the blocked ones, then an UPDATE.
        """
        not_done = [s for s in Job.State.values if s != Job.State.DONE]
        edges = JobDependency.objects.using(self.using)
        found = set(
            edges.filter(job_id__in=self.id_set(ids))
            .filter(
                Q(awaits=False, depends_on__state__in=not_done)
                | Q(awaits=True, depends_on__state__in=Job.UNFINISHED_STATES)
            )
            .values_list("job_id", "awaits")
        )
        blocked = {pk for pk, awaits in found if not awaits}
        awaiting = sorted({pk for pk, awaits in found if awaits} - blocked)
        if awaiting:
            need = {
                pk: count or 0
                for pk, count in JobWait.objects.using(self.using)
                .filter(job_id__in=awaiting, count__isnull=False)
                .values_list("job_id", "count")
            }
            final: dict[int, int] = dict(
                edges.filter(job_id__in=sorted(need), awaits=True)
                .filter(depends_on__state__in=Job.TERMINAL_STATES)
                .values_list("job_id")
                .annotate(n=Count("pk"))
                .values_list("job_id", "n")
            ) if need else {}  # fmt: skip
            blocked.update(pk for pk in awaiting if pk not in need or final.get(pk, 0) < need[pk])
        runnable = [pk for pk in ids if pk not in blocked]
        if not runnable:
            return set()
        jobs = Job.objects.using(self.using)
        chosen = jobs.filter(pk__in=self.id_set(runnable), state=Job.State.WAITING)
        # A sequenced job goes only as its sequence's head (sequences.py): the others wait.
        heads = JobSequence.objects.using(self.using).filter(
            key=OuterRef("sequence"), head=OuterRef("pk")
        )
        chosen = chosen.filter(Q(sequence__isnull=True) | Q(Exists(heads)))
        queues = set(chosen.order_by().values_list("queue", flat=True).distinct())
        later = Case(
            When(run_after__gt=DbNow(), then=Value(Job.State.SCHEDULED)),
            default=Value(Job.State.READY),
        )
        return queues if chosen.update(state=later, updated_at=DbNow()) else set()

    # -- bulk insert --------------------------------------------------------------------------

    def insert_jobs(self, jobs: list[Job]) -> None:
        """Insert unsaved `jobs` and set their primary keys (one statement where possible)."""
        if not self.connection.features.can_return_rows_from_bulk_insert:
            # MySQL (and SQLite before 3.35) return no ids from a multi-row INSERT, and
            # bulk_create() then sets no primary keys: one INSERT per job.
            for job in jobs:
                job.save(using=self.using, force_insert=True)
            return
        Job.objects.using(self.using).bulk_create(jobs, batch_size=500)

    def _insert_selected(
        self,
        jobs: list[Job],
        found: JobDocument,
        values: list[str],
        params: list[Any],
        source: str,
        *,
        sort_by_id: bool = False,
    ) -> None:
        """Insert `jobs` as `SELECT <values> FROM <source>` over their document (`found`,
        from _insert_document): `values` gives each field's SQL, `params` the parameters of
        the constant ones, and `source` reads the document, the statement's last parameter,
        in the jobs' order. The jobs take the ids and creation times the rows return (in
        their order, or sorted by id where the database returns them unordered)."""
        now, _ = self.compile(DbNow())
        columns = [self.qn(str(f.column)) for f in found.fields]
        sql = (
            f"INSERT INTO {self.qn(Job._meta.db_table)} "
            f"({', '.join(columns)}, created_at, updated_at) "
            f"SELECT {', '.join(values)}, {now}, {now} FROM {source} "
            "RETURNING id, created_at"
        )
        conn = self.connection
        created_at = Job._meta.get_field("created_at")
        converters = conn.ops.get_db_converters(created_at.get_col(Job._meta.db_table))
        with self.cursor() as cursor:
            cursor.execute(sql, [*params, found.document])
            rows = cursor.fetchall()
        for job, (pk, created) in zip(jobs, sorted(rows) if sort_by_id else rows, strict=True):
            for convert in converters:
                created = convert(created, created_at, conn)
            job.id = pk  # the attribute, not the `pk` property: thousands of jobs
            job.created_at = job.updated_at = created
            job._state.adding = False
            job._state.db = self.using

    def _insert_document(self, jobs: list[Job]) -> JobDocument | None:
        """The jobs' columns as one JSON document (a list of rows), or None if it cannot be.

        JSON columns travel as JSON inside it (objects, arrays or null: what a new job's
        JSON columns hold), datetimes as the text this database stores; `created_at` and
        `updated_at` are left to the database clock. Anything else takes the generic path.
        A column that holds the same value in every job travels once, as a parameter: most
        columns of a bulk enqueue do, and the database then parses a fraction of the JSON.
        """
        fields = [
            f
            for f in Job._meta.concrete_fields
            if not f.primary_key and f.attname not in ("created_at", "updated_at")
        ]
        read = operator.attrgetter(*(f.attname for f in fields))
        dates = [n for n, f in enumerate(fields) if isinstance(f, DateTimeField)]
        documents = [n for n, f in enumerate(fields) if isinstance(f, JSONField)]
        ops = self.connection.ops
        rows = [list(read(job)) for job in jobs]
        if not rows:
            return None
        # Column by column, the checks in C where they can be (a bulk enqueue of plain jobs
        # spent most of its Python time here, row by row).
        columns = list(zip(*rows, strict=True))
        for n in documents:
            if not set(map(type, columns[n])) <= _JSON_DOCUMENT_TYPES:
                return None
        for n in dates:
            if columns[n].count(None) == len(rows):
                continue
            for row in rows:
                if row[n] is not None:
                    if isinstance(row[n], Expression):
                        return None  # a value the database computes
                    row[n] = str(ops.adapt_datetimefield_value(row[n]))
            columns[n] = tuple(row[n] for row in rows)
        first = rows[0]
        # Equal values of one type (1 == True): the column travels once, as a parameter.
        same = [
            n
            for n, column in enumerate(columns)
            if column.count(first[n]) == len(column) and len(set(map(type, column))) == 1
        ]
        varying = [n for n in range(len(fields)) if n not in set(same)]
        try:
            constants = {
                n: json.dumps(first[n], allow_nan=False)
                if n in documents and first[n] is not None
                else first[n]
                for n in same
            }
            document = json.dumps([[row[n] for n in varying] for row in rows], allow_nan=False)
        except (TypeError, ValueError):
            return None  # an expression or an odd value somewhere: the generic path
        return JobDocument(fields, constants, varying, document, len(rows))

    def id_set(self, ids: Sequence[int]) -> Any:
        """What `pk__in=` takes for many ids: here the list (an IN list of parameters).

        A dialect whose database can take the ids as one parameter (an array, a JSON
        document) returns a subquery instead: long lists cost Django and the database less.
        """
        return list(ids)

    def json_append(self, column: str, value: str) -> Expression:
        """An expression appending the string `value` to the JSON array in `column`."""
        raise NotImplementedError

    def json_append_sql(self, column: str) -> str:
        """Raw SQL appending a string parameter (%s) to the JSON array in `column`."""
        raise NotImplementedError

    def claim_sets(self, owner: str, lease_ttl: float, prefix: str = "") -> tuple[str, list[Any]]:
        """The SET list (raw SQL, and its parameters) of marking claimed rows running.

        Built once per lease TTL from the ORM's own SQL for the database clock; `prefix`
        qualifies the columns read (a table alias and a dot).
        """
        served = registry.served()
        key = ("claim_sets", lease_ttl, prefix, served)
        if key not in self._sql_cache:
            now, _ = self.compile(DbNow())
            expires, expires_params = self.compile(DbNow() + seconds(lease_ttl))
            version, version_params = self.first_version_sql(served, prefix)
            self._sql_cache[key] = (
                f"state = 'running', attempts = {prefix}attempts + 1, lease_owner = %s, "
                f"lease_expires = {expires}, heartbeat_at = {now}, started_at = {now}, "
                f"{version}first_started_at = COALESCE({prefix}first_started_at, {now}), "
                f"updated_at = {now}, "
                f"worker_ids = {self.json_append_sql(prefix + 'worker_ids')}",
                [*expires_params, *version_params],
            )
        sql, params = self._sql_cache[key]
        return sql, [owner, *params, owner]

    def first_version_sql(self, served: versions.Served, prefix: str = "") -> tuple[str, list[Any]]:
        """The SET item (raw SQL ending in ", ", and its parameters) that gives a job not
        started yet the newest version of its handler in `served` (versions.first_version);
        empty when every newest version is "". Placed before first_started_at's, which it
        reads (see _mark)."""
        pinned = versions.newest(served)
        if not pinned:
            return "", []
        whens, params = [], []
        for version, keys in pinned:
            whens.append(f"WHEN {prefix}type IN ({', '.join(['%s'] * len(keys))}) THEN %s")
            params += [*keys, version]
        column = f"{prefix}handler_version"
        return (
            f"handler_version = CASE WHEN {prefix}first_started_at IS NULL THEN CASE "
            f"{' '.join(whens)} ELSE {column} END ELSE {column} END, ",
            params,
        )

    def claim_columns(self, prefix: str = "") -> str:
        """The columns a claim returns (CLAIM_FIELDS), for raw SQL (built once per prefix)."""
        key = ("claim_columns", prefix)
        if key not in self._sql_cache:
            columns = ", ".join(prefix + self.qn(str(f.column)) for f in _claim_fields(Job))
            self._sql_cache[key] = (columns, [])
        return self._sql_cache[key][0]

    def load_claimed(self, rows: Iterable[Sequence[Any]]) -> list[ClaimedJob]:
        """Build ClaimedJob records from raw rows of `claim_columns()`.

        Django's own converters are applied, so values are what the ORM would give.
        """
        conn = self.connection
        key = ("load_claimed", id(conn))
        if key not in self._loaders:
            converters = []
            for n, field in enumerate(_claim_fields(Job)):
                col = field.get_col(Job._meta.db_table)
                found = conn.ops.get_db_converters(col) + field.get_db_converters(conn)
                if found:
                    converters.append((n, found, col))
            self._loaders[key] = converters
        converters = self._loaders[key]
        jobs = []
        for row in rows:
            values = list(row)
            for n, found, col in converters:
                value = values[n]
                if value == "{}" and n == ARGS:  # the usual no-argument job: no JSON parse
                    values[n] = {}
                    continue
                for convert in found:
                    value = convert(value, col, conn)
                values[n] = value
            jobs.append(ClaimedJob(self.using, values))
        return jobs

    def qn(self, name: str) -> str:
        """Quote a table or column name."""
        return self.connection.ops.quote_name(name)

    # -- the claim ---------------------------------------------------------------------------

    def claim_ready(
        self,
        ready: JobQuerySet,
        *,
        owner: str,
        limit: int,
        lease_ttl: float,
        shape: Any = None,
    ) -> list[ClaimedJob]:
        """Lock up to `limit` of the `ready` jobs in claim order and mark them running.

        Runs inside the claim transaction. Portable version: a locking read, then an UPDATE
        by ids (two statements). `shape`: see compile_claim().
        """
        if queues := merged_queues(shape):  # a few queues: each one's index, merged
            key = ("claim_rows", shape, limit)
            if key not in self._sql_cache:
                self._sql_cache[key] = self.compile_merged(ready, limit, queues, ids=False)
            sql, params = self._sql_cache[key]
            with self.cursor() as cursor:
                cursor.execute(sql, params)
                jobs = self.load_claimed(cursor.fetchall())
            return self._mark(jobs, owner=owner, lease_ttl=lease_ttl)
        best = self.lock(ready.order_by("-priority", "pk")).values_list(*CLAIM_FIELDS)[:limit]
        # A worker that serves one queue reads that queue's own index: through the ready
        # index it would read every other queue's ready jobs ahead of its own.
        one_queue = [READY_QUEUE_INDEX] if len(served_queues(shape)) == 1 else []
        rows = self.read_through(best, one_queue)
        return self._mark(self._from_orm(rows), owner=owner, lease_ttl=lease_ttl)

    def mark_claimed(
        self, ids: list[int], *, owner: str, lease_ttl: float, last: bool = False
    ) -> list[ClaimedJob]:
        """Mark the locked jobs `ids` running under a new lease of `owner`; return them.

        `last`: the caller runs nothing more in its transaction (run_in_transaction's), so a
        dialect may commit it with this statement; here it is committed as ever, after it.
        """
        if not ids:
            return []
        rows = Job.objects.using(self.using).filter(pk__in=ids).values_list(*CLAIM_FIELDS)
        found = {job.id: job for job in self._from_orm(rows)}
        return self._mark([found[i] for i in ids if i in found], owner=owner, lease_ttl=lease_ttl)

    def _from_orm(self, rows: Iterable[Sequence[Any]]) -> list[ClaimedJob]:
        """ClaimedJob records from ORM `values_list(*CLAIM_FIELDS)` rows (converted already)."""
        return [ClaimedJob(self.using, row) for row in rows]

    def _mark(self, jobs: list[ClaimedJob], *, owner: str, lease_ttl: float) -> list[ClaimedJob]:
        if not jobs:
            return []
        served = registry.served()
        version = versions.first_version(served)
        rows = Job.objects.using(self.using).filter(pk__in=[j.id for j in jobs])
        rows.update(
            state=Job.State.RUNNING,
            attempts=F("attempts") + 1,
            lease_owner=owner,
            lease_expires=DbNow() + seconds(lease_ttl),
            heartbeat_at=DbNow(),
            started_at=DbNow(),
            # Before first_started_at, which it reads: MySQL's UPDATE assigns left to right,
            # each assignment seeing the values assigned before it.
            **({} if version is None else {"handler_version": version}),
            first_started_at=Coalesce(F("first_started_at"), DbNow()),
            updated_at=DbNow(),
            worker_ids=self.json_append("worker_ids", owner),
        )
        for job in jobs:
            job.state = Job.State.RUNNING
            job.attempts += 1
            job.lease_owner = owner
        if version is not None:
            # The rows were read before the UPDATE: read back the versions it may have given.
            pinned = [
                j.id for j in jobs if not j.handler_version and versions.newest_of(served, j.type)
            ]
            if pinned:
                found = dict(rows.filter(pk__in=pinned).values_list("pk", "handler_version"))
                for job in jobs:
                    job.handler_version = found.get(job.id, job.handler_version)
        return jobs

    # -- the batched finish ------------------------------------------------------------------

    def finish_many(
        self, *, owner: str, items: Sequence[tuple[int, int, str | None]]
    ) -> FinishReport:
        """Store each (job id, attempt, result as JSON text) and mark the job done, fenced.

        Runs inside a transaction. A row another transaction holds locked is skipped (`busy`)
        rather than waited for; a row whose lease is no longer (owner, attempt) is `lost`. A
        job whose cancellation was requested ends `cancelled` and its result is discarded.
        Portable version: a locking read, then one UPDATE per final state.
        """
        jobs = Job.objects.using(self.using)
        wanted = {job_id: attempt for job_id, attempt, _ in items}
        fence = jobs.filter(pk__in=list(wanted), lease_owner=owner, state__in=Job.LEASED_STATES)
        rows = list(
            self.lock(fence.order_by("pk")).values_list(
                "pk", "attempts", "cancel_requested", "parent_id", "has_dependents", "has_children"
            )
        )
        report = FinishReport()
        mine = [r for r in rows if wanted[r[0]] == r[1]]
        self._sort_missing(report, wanted, {r[0] for r in mine}, owner)
        texts = {job_id: text for job_id, _, text in items}
        done = [r for r in mine if not r[2]]
        cancelled = [r for r in mine if r[2]]
        if done:
            ids = [r[0] for r in done]
            values = terminal_columns(Job.State.DONE)
            if any(texts[i] is not None for i in ids):
                # JSON text straight into the column: SQLite and MariaDB store JSON as text,
                # MySQL parses a string assigned to a JSON column.
                values["result"] = Case(
                    *(When(pk=i, then=Value(texts[i])) for i in ids if texts[i] is not None),
                    default=Value(None),
                    output_field=TextField(),
                )
            jobs.filter(pk__in=ids).update(**values)
        if cancelled:
            jobs.filter(pk__in=[r[0] for r in cancelled]).update(
                **terminal_columns(Job.State.CANCELLED)
            )
        for pk, _, cancel, parent_id, has_dependents, has_children in mine:
            state = Job.State.CANCELLED if cancel else Job.State.DONE
            report.finished.append(
                Finished(pk, str(state), parent_id, has_dependents, has_children)
            )
        return report

    def _sort_missing(
        self, report: FinishReport, wanted: dict[int, int], mine: set[int], owner: str
    ) -> None:
        """File the jobs of `wanted` not in `mine` as busy (locked elsewhere) or lost."""
        missing = sorted(set(wanted) - mine)
        if not missing:
            return
        still = dict(
            Job.objects.using(self.using)
            .filter(pk__in=missing, lease_owner=owner, state__in=Job.LEASED_STATES)
            .values_list("pk", "attempts")
        )
        gone = []
        for job_id in missing:
            if self.has_select_for_update_skip_locked and still.get(job_id) == wanted[job_id]:
                report.busy.append(job_id)
            else:
                gone.append(job_id)
        if not gone:
            return
        earlier = self.finished_by(owner, {job_id: wanted[job_id] for job_id in gone})
        for job_id in gone:
            if job_id in earlier:
                report.recorded.append((job_id, earlier[job_id]))
            else:
                report.lost.append(job_id)

    def finished_by(self, owner: str, wanted: dict[int, int]) -> dict[int, str]:
        """Return {job id: state} of the jobs of `wanted` (id: attempt) that `owner`'s lease
        of that attempt finished: `done`, or `cancelled` as a finish ends it.

        A write whose COMMIT was sent but whose reply was lost (the connection dropped) is
        retried, and then finds its own work done: that is not a lost lease. The claim of
        an attempt is the last to append to `worker_ids` and bumps `attempts`; a reclaim of
        that attempt records a lease error with its number; so a final row with this attempt,
        this owner last, and no error of this attempt was finished by this lease.
        """
        rows = (
            Job.objects.using(self.using)
            .filter(pk__in=list(wanted), state__in=(Job.State.DONE, Job.State.CANCELLED))
            .values_list("pk", "state", "attempts", "worker_ids", "last_error")
        )
        found = {}
        for pk, state, attempts, worker_ids, last_error in rows:
            if attempts != wanted[pk] or not worker_ids or worker_ids[-1] != owner:
                continue
            if isinstance(last_error, dict) and last_error.get("attempt") == attempts:
                continue  # this attempt failed (reclaimed): not finished by the lease
            found[pk] = str(state)
        return found


def read_json(value: Any) -> Any:
    """A JSON column's value as read by a raw cursor: text on some backends, parsed on others."""
    return json.loads(value) if isinstance(value, str) else value


_LAZY = object()  # Dialect.cursor(): the transaction's cursor is made at its first use
_MARK = "\x00group"  # group_reads_sql(): the group's place among a read's parameters
MERGED_READS = 32  # group_reads_sql(): the most groups' reads in one UNION ALL

# A claim of at most this many queues (a worker's --queue list) reads each queue's ready
# index and merges them (Dialect.compile_merged); a claim of more reads the ready index.
MERGED_QUEUES = 8


def served_queues(shape: Any) -> list[str]:
    """The queues a claim of `shape` (queues, handler types, paused queues) names and may
    take jobs of (not paused), each once; none when it names none (all queues)."""
    return [] if shape is None else [q for q in dict.fromkeys(shape[0]) if q not in shape[2]]


def merged_queues(shape: Any) -> list[str]:
    """The queues whose reads a claim of `shape` merges (compile_merged): its served queues
    if they are two to MERGED_QUEUES; else none (it reads the ready index, or one queue's)."""
    queues = served_queues(shape)
    return queues if 1 < len(queues) <= MERGED_QUEUES else []


def _claim_fields(model: Any) -> list[Field[Any, Any]]:
    return [model._meta.get_field(name.removesuffix("_id")) for name in CLAIM_FIELDS]


def terminal_columns(state: str, **extra: Any) -> dict[str, Any]:
    """Return the column values of a move to the final `state` (ends lease and unique slot)."""
    return {
        "state": state,
        "lease_owner": None,
        "lease_expires": None,
        "finished_at": DbNow(),
        "updated_at": DbNow(),
        "unique_slot": None,
        **extra,
    }


def aware(value: Any) -> dt.datetime:
    """A datetime read by raw SQL, as an aware UTC datetime: SQLite gives text, MySQL and
    MariaDB naive datetimes (stored datetimes are UTC: USE_TZ, see E003)."""
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    moment: dt.datetime = value.astimezone(dt.UTC)
    return moment
