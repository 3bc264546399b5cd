"""Connection names: each connection a worker opens says which worker and duty it serves.

An operator reading `pg_stat_activity` sees `jobqueue heartbeat <worker id>`,
`jobqueue dispatcher <worker id>`, `jobqueue handler <worker id>` and so on, instead of rows
that all look alike. The name comes from the thread that opens the connection (each duty runs
on a thread named `jobqueue-<duty>`), and is set as the connection is opened, so it holds
through reconnects. Where the database has no such name (MySQL/MariaDB, SQLite), nothing is
sent.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError
from django.db.backends.signals import connection_created

from ..dialects import get_dialect
from ..exceptions import UnsupportedDatabaseError
from . import connection_pool

logger = logging.getLogger(__name__)

# Thread names that are not "jobqueue-<duty>": the main thread runs the dispatcher, and the
# executor's threads run handlers.
_ROLES = {"MainThread": "dispatcher", "jobqueue-exec": "handler"}


def label(thread_name: str, worker_id: str) -> str:
    """Return the connection name of a thread of worker `worker_id`."""
    role = _ROLES.get(thread_name) or thread_name.removeprefix("jobqueue-")
    return f"jobqueue {role} {worker_id}"


def install(worker_id: str, *, role: str | None = None) -> Callable[[], None]:
    """Name every connection this process opens from now on; return the undo.

    With `role`, every connection is named for it (the watchdog's process: `jobqueue
    watchdog <worker id>`); else for the thread that opens it.
    """

    # The name each server connection was given: a pooled one, handed out again (a job at a
    # time, or a query at a time), keeps its name without a statement more.
    named: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
    lock = threading.Lock()

    def name(sender: Any, connection: Any, **kwargs: Any) -> None:
        try:
            dialect = get_dialect(connection.alias)
        except UnsupportedDatabaseError:  # a handler's connection to a database of its own
            return
        text = (
            f"jobqueue {role} {worker_id}"
            if role
            else label(threading.current_thread().name, worker_id)
        )
        # Only a pooled connection is handed out again (and psycopg's can be weakly referenced;
        # sqlite3's and MySQLdb's cannot).
        raw = connection.connection if connection_pool.pooled(connection) else None
        with lock:
            if raw is not None and named.get(raw) == text:
                return
        # The name is the worker's statement, not one of the job whose query opened the
        # connection (a pooled one): execute wrappers, a handler's or the worker's check of a
        # job's first statement (connection_health), do not see it.
        wrappers, connection.execute_wrappers = connection.execute_wrappers, []
        try:
            dialect.name_session(text)
        except DatabaseError:  # a name is never worth a failed connection
            logger.debug("Could not name a connection of %s", connection.alias, exc_info=True)
            return
        finally:
            connection.execute_wrappers = wrappers
        if raw is not None:
            with lock:
                named[raw] = text

    connection_created.connect(name, weak=False)

    def uninstall() -> None:
        connection_created.disconnect(name)

    return uninstall
