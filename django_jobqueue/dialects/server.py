"""The server and the session: what a dialect says about its database, and its upkeep.

Owns the checks of the server (`check_server`, `system_checks`), its description for logs,
the collation of key columns, the session's name, the wake-up of idle workers in other
processes (`notify` and the trigger a migration makes), and the upkeep of the queue's tables
(`storage_tuning`, `maintain`). Nothing by default: a vendor overrides what its server has.

Invariant: nothing here touches jobs' rows.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.core import checks

from ..models.fields import key_collation
from .sql import SQL


class Server(SQL):
    """Checks, description and session name of the server, wake-ups, and table upkeep."""

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

    def name_session(self, name: str) -> None:
        """Give this thread's (just opened) connection a name the server shows its operators.

        Nothing by default: only some databases have a name a client can set.
        """

    def notify(self, queues: Iterable[str]) -> None:
        """Tell workers in other processes that `queues` have ready work, on commit."""

    def create_notify_trigger(self, schema_editor: Any, table: str) -> None:
        """Create whatever makes an INSERT of ready jobs wake workers (a migration step)."""

    def drop_notify_trigger(self, schema_editor: Any, table: str) -> None:
        """Undo create_notify_trigger()."""

    def storage_tuning(self) -> list[str]:
        """Statements that tune the queue tables' storage for their churn (none by default)."""
        return []

    def maintain(self, *, min_rows: int, fraction: float) -> list[str]:
        """Do the upkeep of the queue's tables that the database is not doing; return the
        statements run (none by default: the database keeps its own tables in shape).

        A table is due once `min_rows` rows, and `fraction` of its live rows, have died or
        changed since the database last did it.
        """
        return []
