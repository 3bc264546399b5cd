"""Temporary extra database aliases: an SQLite file, or a second connection to the test database.

SQLite ships with Python, so an extra SQLite alias is available whatever DATABASE_URL names:
tests that need a second alias (a transaction open on another database, a queue database the
system checks inspect) use one on every vendor instead of being skipped on PostgreSQL/MySQL.
override_settings(DATABASES=...) is not an option: Django warns that it is unsupported, and
the suite turns warnings into errors. The alias is added to (and removed from) the live
settings instead, and its connection is closed and forgotten on exit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.db import DEFAULT_DB_ALIAS, connections


@contextmanager
def sqlite_alias(
    alias: str, path: Path, *, options: dict[str, Any] | None = None, migrate: bool = False
) -> Iterator[str]:
    """Make `alias` an SQLite database stored at `path` for the duration of the block."""
    config: dict[str, Any] = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(path),
        "OPTIONS": dict(options or {}),
    }
    with _alias(alias, config, migrate=migrate):
        yield alias


@contextmanager
def second_connection(alias: str, *, options: dict[str, Any]) -> Iterator[str]:
    """Make `alias` another connection to the database under test, with `options` added."""
    default = settings.DATABASES[DEFAULT_DB_ALIAS]
    config = {**default, "OPTIONS": {**default.get("OPTIONS", {}), **options}}
    with _alias(alias, config, migrate=False):
        yield alias


@contextmanager
def _alias(alias: str, config: dict[str, Any], *, migrate: bool) -> Iterator[None]:
    assert alias not in settings.DATABASES, alias
    # Fill in the defaults Django adds to every alias (ATOMIC_REQUESTS, TEST, ...) in place.
    connections.configure_settings(
        {DEFAULT_DB_ALIAS: settings.DATABASES[DEFAULT_DB_ALIAS], alias: config}
    )
    settings.DATABASES[alias] = config
    if connections.settings is not settings.DATABASES:  # pragma: no cover - defensive
        connections.settings[alias] = config
    try:
        # Django's test cases refuse to open connections to aliases that were not declared
        # when the test class was set up ("threaded connections ... are not allowed"); the
        # check only guards connections not yet open, so open this one eagerly.
        connections[alias].connect()
        if migrate:
            call_command("migrate", database=alias, verbosity=0, interactive=False)
        yield
    finally:
        with suppress(AttributeError):
            connections[alias].close()
            del connections[alias]
        settings.DATABASES.pop(alias, None)
        connections.settings.pop(alias, None)
