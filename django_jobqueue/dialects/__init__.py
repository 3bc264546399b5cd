"""The database differences of the queue's statements; `get_dialect` is the only vendor switch.

The model plumbing whose SQL differs per database (key fields, expressions, indexes) is in
`models/`, below this package: the dialects use the models, never the other way round.
"""

from __future__ import annotations

from django.db import connections

from ..exceptions import UnsupportedDatabaseError
from .base import Dialect, TransientDatabaseError

__all__ = ["Dialect", "TransientDatabaseError", "get_dialect"]


def get_dialect(using: str) -> Dialect:
    """Return the dialect for the database alias `using`."""
    vendor = connections[using].vendor
    if vendor == "postgresql":
        from .postgresql import PostgreSQLDialect

        return PostgreSQLDialect(using)
    if vendor == "mysql":
        from .mysql import MySQLDialect

        return MySQLDialect(using)
    if vendor == "sqlite":
        from .sqlite import SQLiteDialect

        return SQLiteDialect(using)
    raise UnsupportedDatabaseError(
        f"Database {using!r} is {vendor}; django_jobqueue supports PostgreSQL, "
        "MySQL 8.0.1+/MariaDB 10.6+ and SQLite."
    )
