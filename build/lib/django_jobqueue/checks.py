"""System checks: settings, database versions, SQLite journal and transaction modes."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.utils.module_loading import import_string

from . import conf


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E001: JOBQUEUE must be valid.  E003: USE_TZ must be on.  E004: DYNAMIC_LIMIT imports."""
    errors: list[checks.CheckMessage] = []
    try:
        loaded = conf.load()
    except ImproperlyConfigured as exc:
        errors.append(checks.Error(str(exc), id="django_jobqueue.E001"))
        loaded = None
    if not settings.USE_TZ:
        errors.append(
            checks.Error(
                "USE_TZ is False: django-jobqueue compares lease deadlines and run_after with "
                "the database clock, and naive local times jump at daylight-saving changes "
                "(every lease would look expired, or backoffs would stretch by an hour).",
                hint="Set USE_TZ = True (Django's default since 5.0).",
                id="django_jobqueue.E003",
            )
        )
    if loaded is not None and isinstance(loaded.dynamic_limit, str):
        try:
            func = import_string(loaded.dynamic_limit)
        except ImportError as exc:
            errors.append(
                checks.Error(
                    f"JOBQUEUE['DYNAMIC_LIMIT'] {loaded.dynamic_limit!r} cannot be imported: {exc}",
                    id="django_jobqueue.E004",
                )
            )
        else:
            if not callable(func):
                errors.append(
                    checks.Error(
                        f"JOBQUEUE['DYNAMIC_LIMIT'] {loaded.dynamic_limit!r} is not callable.",
                        id="django_jobqueue.E004",
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
    return [*_server_messages(using), *_unhandled_work(using)]


def _unhandled_work(using: str) -> list[checks.CheckMessage]:
    """W005: ready jobs of types that no live worker has a handler for (a deploy left behind)."""
    from django.db import DatabaseError

    from .dialects.functions import DbNow
    from .models import Job, Worker

    try:
        live = list(
            Worker.objects.using(using)
            .filter(expires_at__gt=DbNow())
            .values_list("handlers", flat=True)
        )
        if not live:
            return []  # no worker to compare with: jobqueue_stats reports that
        known = sorted({key for handlers in live for key in handlers or []})
        waiting = list(
            Job.objects.using(using)
            .filter(state=Job.State.READY)
            .exclude(type__in=known)
            .order_by()
            .values_list("type", flat=True)
            .distinct()[:10]
        )
    except DatabaseError:
        return []  # not migrated yet, or unreachable: other checks and commands say so
    if not waiting:
        return []
    return [
        checks.Warning(
            f"Ready jobs wait for handlers that no live worker has: {', '.join(waiting)}.",
            hint="Deploy workers whose code registers these handlers (a rolling deploy in "
            "progress clears this by itself), or cancel the jobs.",
            id="django_jobqueue.W005",
        )
    ]


def _server_messages(using: str) -> list[checks.CheckMessage]:
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
