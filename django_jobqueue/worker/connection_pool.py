"""Django's connection pool in a worker (PostgreSQL, Django 5.1+, `OPTIONS["pool"]`).

Handler threads borrow from the pool: a job's first query takes a connection and the end of
the job gives it back (`give_back`), so a worker's handler connections are bounded by the
pool's `max_size` whatever its `--concurrency`, and jobs wait for a pooled connection rather
than open one each. The worker's own threads (the dispatcher, heartbeat, completer,
housekeeper, listener and maintainer) never borrow (`outside_pool`): each opens one connection
of its own beside the pool, so that a beat or a claim never queues behind handlers for one.
With `JOBQUEUE["POOL_RETURN"] = "query"` a handler gives its pooled connection back whenever
its last cursor closes outside a transaction (`return_after_queries`), as PgBouncer's
transaction mode would. Without a pool each handler thread keeps its connection between jobs
and closes it after `executor.IDLE_CLOSE` seconds without work (docs: howto/scale-out.md,
"Connections").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper

logger = logging.getLogger(__name__)


def pooled(conn: BaseDatabaseWrapper) -> bool:
    """Whether `conn`'s alias is configured with a connection pool."""
    return bool(conn.settings_dict.get("OPTIONS", {}).get("pool"))


def outside_pool(alias: str) -> None:
    """Give the calling thread a connection to `alias` of its own, beside the alias's pool."""
    conn = connections[alias]
    if not pooled(conn):
        return
    conn.close()  # a pooled connection this thread holds goes back
    options = {k: v for k, v in conn.settings_dict["OPTIONS"].items() if k != "pool"}
    connections[alias] = type(conn)({**conn.settings_dict, "OPTIONS": options}, alias)


def give_back(aliases: Iterable[str]) -> None:
    """Return this thread's pooled connections to their pools (a handler's, between jobs)."""
    for alias in aliases:
        conn = connections[alias]
        if conn.connection is not None and not conn.in_atomic_block and pooled(conn):
            conn.close()
        tracker = getattr(conn, "_jobqueue_cursors", None)
        if tracker is not None:
            tracker.open = 0  # cursors of the connection given back count no more


class _Cursors:
    """The cursors open on one thread's pooled connection, and whether it is connecting."""

    def __init__(self) -> None:
        self.open = 0
        self.connecting = False


class _Closing:
    """A database cursor that reports its close (every other attribute is the cursor's)."""

    def __init__(self, cursor: Any, on_close: Callable[[], None]) -> None:
        self._cursor = cursor
        self._on_close = on_close

    def close(self) -> None:
        try:
            self._cursor.close()
        finally:
            self._on_close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)

    def __iter__(self) -> Any:
        return iter(self._cursor)


def return_after_queries(alias: str) -> None:
    """`POOL_RETURN = "query"`: this thread gives its pooled connection to `alias` back each
    time its last cursor closes outside a transaction, not only when the job ends.

    A job that queries, then waits (an HTTP call, a sleep), holds no connection through the
    wait: as with PgBouncer's transaction mode, a pool of a few connections serves many
    threads, and a session's state (a SET, a temporary table, a session advisory lock) does not
    outlive the query. A transaction keeps its connection to its end (and to the next query).
    """
    conn = connections[alias]
    if not pooled(conn) or hasattr(conn, "_jobqueue_cursors"):
        return
    cursors = _Cursors()
    make_cursor, make_debug_cursor, connect = conn.make_cursor, conn.make_debug_cursor, conn.connect

    def closed() -> None:
        cursors.open = max(0, cursors.open - 1)
        if (
            cursors.open == 0
            and not cursors.connecting  # a cursor of connect()'s own (the session's name)
            and conn.connection is not None
            and not conn.in_atomic_block
            and conn.autocommit
        ):
            try:
                conn.close()
            except DatabaseError:  # the pool refused it back: the next query connects anew
                logger.debug("Could not give a pooled connection back", exc_info=True)

    def track(cursor: Any) -> Any:  # a _Closing, in the raw cursor's place
        cursors.open += 1
        return _Closing(cursor, closed)

    def connecting() -> None:
        cursors.connecting = True
        try:
            connect()
        finally:
            cursors.connecting = False

    conn.make_cursor = lambda cursor: make_cursor(track(cursor))  # type: ignore[method-assign]
    conn.make_debug_cursor = lambda cursor: make_debug_cursor(track(cursor))  # type: ignore[method-assign]
    conn.connect = connecting  # type: ignore[method-assign]
    conn._jobqueue_cursors = cursors  # type: ignore[attr-defined]
