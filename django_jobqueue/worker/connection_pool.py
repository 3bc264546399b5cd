"""Django's connection pool in a worker (PostgreSQL, Django 5.1+, `OPTIONS["pool"]`).

Handler threads borrow from the pool: a job's first query takes a connection and the end of
the job gives it back (`give_back`), so a worker's handler connections are bounded by the
pool's `max_size` whatever its `--concurrency`, and jobs wait for a pooled connection rather
than open one each. The worker's own threads (the dispatcher, heartbeat, completer,
housekeeper, listener and maintainer) never borrow (`outside_pool`): each opens one connection
of its own beside the pool, so that a beat or a claim never queues behind handlers for one.
Without a pool each handler thread keeps its connection between jobs and closes it after
`executor.IDLE_CLOSE` seconds without work (docs: howto/scale-out.md, "Connections").
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper


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
