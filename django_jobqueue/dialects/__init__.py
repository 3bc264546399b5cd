"""Every database difference lives in this package; `get_dialect` is the only vendor switch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import connections

from ..exceptions import UnsupportedDatabaseError

if TYPE_CHECKING:
    from .base import Dialect, TransientDatabaseError

__all__ = ["Dialect", "TransientDatabaseError", "get_dialect"]


def __getattr__(name: str) -> Any:
    # The dialects import the models, and the models import this package's fields, functions
    # and indexes: loading base only when a name of it is asked for keeps that no circle.
    if name in ("Dialect", "TransientDatabaseError"):
        from . import base

        value = getattr(base, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
