"""Transactions and their bounds: how a dialect writes, waits and retries.

Owns the worker's write transactions (`run_in_transaction`, retried whole on lock contention
up to `transient_retries` times, then `TransientDatabaseError`), the statements run alone in
autocommit (`run_statement`), savepoints of a caller's transaction, the bounds of lock waits,
idle time and statement time (`bound_waits`, `transaction_waits`, `statement_timeout`), the
row-lock clauses of querysets (`lock`, `lock_blocking`), and the one cursor a transaction's
statements share (`cursor`, `execute_together`, `write_together`).

Invariant: a worker transaction never runs inside another (a savepoint is asked for by name:
`run_in_caller_transaction`, `step_transaction`), and whatever bounds it sets end with it.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any, TypeVar

from django.db import DatabaseError, transaction
from django.db.models import QuerySet

from .sql import SQL, result_of

# The name this logger had before dialects/ was split by concept: logging settings name it.
logger = logging.getLogger("django_jobqueue.dialects.base")

T = TypeVar("T")
M = TypeVar("M", bound=Any)


class TransientDatabaseError(DatabaseError):
    """A write transaction kept failing on lock contention after bounded retries."""

    # The path error records and telemetry name it by, as before dialects/ was split: the
    # class is importable there too (base.py re-exports it).
    __module__ = "django_jobqueue.dialects.base"


def statement_bound(lock_timeout: float, idle_timeout: float) -> float:
    """How long a statement of a worker transaction may run: as long as the transaction may
    sit idle (the lease TTL), and never less than twice its lock wait bound, so that a wait
    for a lock still ends as a lock timeout (a transient error, retried at once)."""
    return max(idle_timeout, 2 * lock_timeout)


_LAZY = object()  # Dialect.cursor(): the transaction's cursor is made at its first use


class Transactions(SQL):
    """Write transactions, their retries and bounds, savepoints, and the shared cursor."""

    # Attempts of a write transaction that hits lock contention, and its backoff.
    transient_retries = 8
    transient_backoff = 0.01

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

    def begin(self) -> None:
        """Prepare the connection for a write transaction; called inside atomic()."""

    def is_transient(self, exc: BaseException) -> bool:
        """Whether `exc` is lock contention that a retry of the whole transaction may cure."""
        return False

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

    def lock(self, queryset: QuerySet[M]) -> QuerySet[M]:
        """Return `queryset` with the row locks a claim needs."""
        return queryset.select_for_update(skip_locked=True)

    def lock_blocking(self, queryset: QuerySet[M]) -> QuerySet[M]:
        """Return `queryset` locking its rows, waiting for other holders."""
        return queryset.select_for_update()

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
