"""Connections that survive a database restart: a thread checks its own after the worker saw
trouble, and a job that meets a dead one before touching it is not charged.

A server restart closes every connection of a worker, and a thread learns of it only when it
next uses its own: a handler thread busy (or waiting for work) during the restart would hand
its next job a dead connection, failing its first query. Django checks a connection only when
told (CONN_HEALTH_CHECKS, at a request's start), and a worker serves no requests, so:

- the worker counts the database trouble it meets (`epoch`): the dispatcher, every duty and
  every handler thread bump it on an error of the connection itself (`note`);
- a handler thread, before a job and before it gives back a pooled connection, pings its
  connections (Django's `is_usable()`) when the epoch moved since they were last known good,
  closing those that fail (`refresh`): the job then connects afresh. A worker without trouble
  pings nothing, so short jobs pay no round trip each;
- a job whose first statement on the thread's connection fails on a dead connection (the
  server closed it before the job touched it, so nothing had noticed) is handed back without
  charging an attempt (`FirstStatement`, `spare`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from ..dialects import Dialect
from . import connection_pool

logger = logging.getLogger(__name__)

# Errors of the connection (the server gone, the link cut), as Django wraps every driver's.
CONNECTION_ERRORS = (OperationalError, InterfaceError)

_lock = threading.Lock()
_epoch = 0
_pools_checked: dict[str, int] = {}  # alias -> the epoch its pool's idle ones were checked at
_local = threading.local()  # `known`: the epoch this thread's connections were last good at


def epoch() -> int:
    """How many times this worker met database trouble (a moving count, never reset)."""
    return _epoch


def bump() -> None:
    """Count database trouble: every thread checks its connections before its next job."""
    global _epoch
    with _lock:
        _epoch += 1


def note(exc: BaseException, dialect: Dialect) -> None:
    """Count `exc` as trouble if it is an error of the connection, not lock contention."""
    if isinstance(exc, CONNECTION_ERRORS) and not dialect.is_transient(exc):
        bump()


def refresh(aliases: Iterable[str]) -> None:
    """Close this thread's connections that fail a ping, if the worker met trouble since they
    were last known good; check a pool's idle connections once per trouble.

    A connection inside a transaction is left alone: its owner meets the error, if any.
    """
    now = _epoch
    if getattr(_local, "known", None) == now:
        return
    _local.known = now
    for alias in aliases:
        conn = connections[alias]
        if conn.in_atomic_block:
            continue
        if conn.connection is not None:
            if not conn.is_usable():
                conn.close()
        elif connection_pool.pooled(conn):
            _check_pool(conn, now)


def _check_pool(conn: BaseDatabaseWrapper, now: int) -> None:
    """Have the alias's pool replace its idle connections that are dead (once per epoch)."""
    with _lock:
        if _pools_checked.get(conn.alias, -1) >= now:
            return
        _pools_checked[conn.alias] = now
    try:
        conn.pool.check()  # type: ignore[attr-defined]  # psycopg_pool's, through Django
    except Exception:  # the pool checks itself again later; a job meets what is left
        logger.debug("Could not check the connection pool of %r", conn.alias, exc_info=True)


class FirstStatement:
    """An execute wrapper for one job on the thread's queue connection: was its first
    statement refused by a connection found dead?

    It watches the first statement only and then steps out of the way, so a job pays for it
    once. A connection error inside a transaction is judged after the job (`spare`): there a
    ping would fail on any aborted transaction, and Django drops a connection whose rollback
    failed.
    """

    __slots__ = ("_conn", "dead", "failed", "ran", "raw")

    def __init__(self, conn: BaseDatabaseWrapper) -> None:
        self._conn = conn
        self.ran = False  # a statement of the job reached this wrapper
        self.failed = False  # the first statement failed with a connection error
        self.dead: bool | None = None  # the connection was then found unusable (None: later)
        self.raw: Any = conn.connection  # the DB-API connection that statement used
        conn.execute_wrappers.append(self)

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        self.ran = True
        self.detach()
        conn = self._conn
        self.raw = conn.connection
        try:
            return execute(sql, params, many, context)
        except CONNECTION_ERRORS:
            self.failed = True
            if not conn.in_atomic_block:
                self.dead = conn.connection is None or not conn.is_usable()
            raise

    def detach(self) -> None:
        """Stop watching (idempotent)."""
        wrappers = self._conn.execute_wrappers
        if self in wrappers:
            wrappers.remove(self)

    def reset(self) -> None:
        """Close the dead connection (the thread connects afresh) and count the trouble: the
        other threads' connections may be dead too."""
        with contextlib.suppress(DatabaseError):  # a dead link may fail to close: dropped anyway
            self._conn.close()
        self._conn.errors_occurred = False
        bump()


def spare(probe: FirstStatement, error: BaseException | None) -> bool:
    """Whether a failed attempt met a dead connection before touching the database: its first
    statement (or, with none sent, its first use of the connection, as MySQL's autocommit
    switch at a transaction's start) failed with a connection error, and the connection
    is found unusable. The caller resets the connection."""
    if not isinstance(error, CONNECTION_ERRORS) or (probe.ran and not probe.failed):
        return False
    conn = probe._conn
    if probe.dead is not None:
        return probe.dead
    if probe.ran and conn.connection is not probe.raw:
        return True  # Django dropped it: a rollback failed on it
    return conn.connection is not None and not conn.in_atomic_block and not conn.is_usable()
