"""SQLite: no row locks, so a claim takes the database write lock up front (BEGIN IMMEDIATE)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from django.db import DatabaseError, transaction
from django.db.models import QuerySet

from .base import Dialect

M = TypeVar("M", bound=Any)

# Primary result codes of a lock conflict: SQLITE_BUSY, SQLITE_LOCKED.
_BUSY_CODES = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED}


class SQLiteDialect(Dialect):
    vendor = "sqlite"
    has_select_for_update_skip_locked = False
    claim_strategy = "BEGIN IMMEDIATE (database write lock, busy retry with backoff)"
    transient_retries = 12

    def lock(self, queryset: QuerySet[M]) -> QuerySet[M]:
        # select_for_update() is silently ignored on SQLite; the claim is safe only because
        # the transaction took the write lock at BEGIN IMMEDIATE, before reading.
        return queryset

    def lock_blocking(self, queryset: QuerySet[M]) -> QuerySet[M]:
        return queryset

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
