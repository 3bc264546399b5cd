"""Shared transaction and locking logic, and the capability flags dialects override."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import DatabaseError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import QuerySet

logger = logging.getLogger(__name__)

T = TypeVar("T")
M = TypeVar("M", bound=Any)


class TransientDatabaseError(DatabaseError):
    """A write transaction kept failing on lock contention after bounded retries."""


class Dialect:
    """How one database claims, locks and retries; subclasses override only what differs."""

    vendor = "unknown"
    # Whether SELECT ... FOR UPDATE SKIP LOCKED gives row-level claims.
    has_select_for_update_skip_locked = True
    # Human-readable name of the claim strategy, for the worker's start-up line.
    claim_strategy = "SELECT ... FOR UPDATE SKIP LOCKED"
    # Attempts of a write transaction that hits lock contention, and its backoff.
    transient_retries = 8
    transient_backoff = 0.01

    def __init__(self, using: str) -> None:
        self.using = using

    @property
    def connection(self) -> BaseDatabaseWrapper:
        """The current thread's connection for this alias."""
        return connections[self.using]

    def check_server(self) -> None:
        """Raise UnsupportedDatabaseError if this server cannot run the queue."""

    def describe(self) -> str:
        """Return 'flavour version' of the server, for logs."""
        conn = self.connection
        conn.ensure_connection()
        return f"{conn.display_name} {'.'.join(map(str, conn.get_database_version()))}"

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

    def run_in_transaction(self, func: Callable[[], T]) -> T:
        """Run `func` in one write transaction, retrying it whole on transient lock errors.

        `func` must only touch this database: it may run more than once.
        """
        delay = self.transient_backoff
        for attempt in range(1, self.transient_retries + 1):
            try:
                with self._atomic():
                    self.begin()
                    return func()
            except DatabaseError as exc:
                if not self.is_transient(exc):
                    raise
                if attempt == self.transient_retries:
                    raise TransientDatabaseError(
                        f"gave up after {attempt} attempts on lock contention: {exc}"
                    ) from exc
                logger.debug("Transient database error (attempt %s): %s", attempt, exc)
                time.sleep(delay * random.uniform(0.5, 1.5))
                delay = min(delay * 2, 1.0)
        raise AssertionError("unreachable")

    def _atomic(self) -> Any:
        if self.connection.in_atomic_block:
            raise RuntimeError("Worker transactions must not run inside another transaction.")
        return transaction.atomic(using=self.using)
