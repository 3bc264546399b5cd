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
- a job whose first statement would go out on a connection the server had already closed
  (nothing in the worker had noticed yet) is refused it, and handed back without charging
  an attempt (`FirstStatement`, `spare`).
"""

from __future__ import annotations

import contextlib
import logging
import select
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
    """An execute wrapper on a handler thread's queue connection: it refuses a job's first
    statement if the server had closed the connection before it (`refused`).

    The check is a poll of the connection's socket, no round trip: an idle connection has
    nothing to read unless the server ended it (the end of the stream, its farewell message),
    and only then does a ping (Django's `is_usable()`) confirm it. A statement sent on a
    connection that looked alive is never refused, nor its failure spared: the server may
    have run it (MariaDB commits an INSERT whose reply a shutdown cuts off), and an attempt
    that ran must count. The wrapper then steps out of the way: a job pays for it once.
    """

    __slots__ = ("_conn", "ran", "refused", "went_on")

    def __init__(self, conn: BaseDatabaseWrapper) -> None:
        self._conn = conn
        self.ran = False  # a statement of the job reached this wrapper
        self.refused = False  # its first one, on a connection the server had closed
        self.went_on = False  # a statement after the refused one (the handler caught it)

    def watch(self) -> None:
        """Watch the next job's first statement (a thread reuses one wrapper: no allocation)."""
        self.ran = self.refused = self.went_on = False
        self._conn.execute_wrappers.append(self)

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        conn = self._conn
        if self.ran:
            self.went_on = True
        else:
            self.ran = True
            if closed_by_server(conn.connection) and not conn.is_usable():
                # Kept open (the executor resets it after the job) and still watched: a
                # handler that catches this and goes on has touched the database after all.
                self.refused = True
                raise OperationalError(
                    "the server had closed this connection before the job's first statement"
                )
        self.detach()
        return execute(sql, params, many, context)

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


def closed_by_server(raw: Any) -> bool:
    """Whether the server ended this idle DB-API connection: its socket has something to read
    with no statement pending. A poll of the socket (SQLite has none: never)."""
    try:
        fd = raw.fileno()
    except AttributeError:
        return False
    except Exception:  # the driver knows it closed (psycopg raises, as MySQLdb does)
        return True
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLPRI)
        return bool(poller.poll(0))
    return bool(select.select([fd], [], [], 0)[0])


def spare(probe: FirstStatement, error: BaseException | None) -> bool:
    """Whether a failed attempt never touched the database for a connection the server had
    closed: its first statement was refused (and none went on), or, none sent, it failed
    with a connection error on a connection found unusable (MySQL switches autocommit off
    at a transaction's start, before any statement). The caller resets the connection."""
    if error is None:
        return False
    if probe.refused:
        return not probe.went_on
    conn = probe._conn
    return (
        not probe.ran
        and isinstance(error, CONNECTION_ERRORS)
        and conn.connection is not None
        and not conn.in_atomic_block
        and not conn.is_usable()
    )
