"""System checks: settings, database versions, SQLite journal and transaction modes."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from . import conf


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E001: JOBQUEUE must be valid.  W003: USE_TZ should be on."""
    errors: list[checks.CheckMessage] = []
    try:
        conf.load()
    except ImproperlyConfigured as exc:
        errors.append(checks.Error(str(exc), id="django_jobqueue.E001"))
    if not settings.USE_TZ:
        errors.append(
            checks.Warning(
                "USE_TZ is False: job deadlines are compared with the database clock in UTC.",
                hint="Set USE_TZ = True.",
                id="django_jobqueue.W003",
            )
        )
    return errors


@checks.register(checks.Tags.database)
def check_database(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """E002: MySQL/MariaDB too old for SKIP LOCKED.  W001/W002: SQLite not WAL / not IMMEDIATE."""
    try:
        using = conf.load().database
    except ImproperlyConfigured:
        return []  # reported by E001
    if not databases or using not in databases:
        return []
    connection: Any = connections[using]
    if connection.vendor == "mysql":
        from .dialects.mysql import version_error

        connection.ensure_connection()
        problem = version_error(connection.mysql_is_mariadb, connection.mysql_version)
        if problem:
            return [checks.Error(problem, id="django_jobqueue.E002")]
        level = connection.settings_dict.get("OPTIONS", {}).get("isolation_level")
        if level is not None and str(level).lower() != "read committed":
            return [
                checks.Warning(
                    f"Database {using!r} runs transactions at {level!r}: enqueue(), cancel() "
                    "and retry() run in your transaction and need READ COMMITTED to see "
                    "concurrent workers' commits.",
                    hint="Remove 'isolation_level' from OPTIONS (Django's default is READ "
                    "COMMITTED) or set it to 'read committed'.",
                    id="django_jobqueue.W004",
                )
            ]
    if connection.vendor == "sqlite":
        return _sqlite_warnings(using)
    return []


def _sqlite_warnings(using: str) -> list[checks.CheckMessage]:
    from .dialects.sqlite import SQLiteDialect

    connection: Any = connections[using]
    warnings: list[checks.CheckMessage] = []
    if connection.is_in_memory_db():
        return warnings
    if SQLiteDialect(using).journal_mode() != "wal":
        warnings.append(
            checks.Warning(
                f"SQLite database {using!r} is not in WAL mode: workers and your app will "
                "block each other's reads.",
                hint="Add 'init_command': 'PRAGMA journal_mode=WAL;' to its OPTIONS.",
                id="django_jobqueue.W001",
            )
        )
    if (connection.settings_dict.get("OPTIONS", {}).get("transaction_mode") or "").upper() != (
        "IMMEDIATE"
    ):
        warnings.append(
            checks.Warning(
                f"SQLite database {using!r} starts transactions DEFERRED: a transaction that "
                "reads and then enqueues can fail with 'database is locked' under load.",
                hint="Add 'transaction_mode': 'IMMEDIATE' to its OPTIONS.",
                id="django_jobqueue.W002",
            )
        )
    return warnings


@checks.register()
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E010: each entry of JOBQUEUE["SCHEDULES"] must be valid (handler, cron, time zone...)."""
    from . import schedules

    try:
        conf.load()
    except ImproperlyConfigured:
        return []  # reported by E001
    return [checks.Error(problem, id="django_jobqueue.E010") for problem in schedules.problems()]
