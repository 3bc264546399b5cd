"""System checks: settings, database versions, SQLite journal and transaction modes."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks

from . import conf, telemetry
from .dialects import get_dialect
from .exceptions import UnsupportedDatabaseError


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E001: each bad value of JOBQUEUE.  E003: USE_TZ must be on.  E004: DYNAMIC_LIMIT imports.
    W006: OPENTELEMETRY is on without opentelemetry-api."""
    found, usable = conf.examine()
    errors: list[checks.CheckMessage] = [
        checks.Error(p.message, hint=p.hint, id="django_jobqueue.E001") for p in found
    ]
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
    errors += [
        checks.Error(message, id="django_jobqueue.E004")
        for message in conf.dynamic_limit_problems(usable)
    ]
    if usable.opentelemetry is not False and not telemetry.installed():
        errors.append(
            checks.Warning(
                "JOBQUEUE['OPENTELEMETRY'] is on, but opentelemetry-api is not installed: "
                "nothing is traced or measured.",
                hint="pip install 'django-jobqueue[otel]', or turn the setting off.",
                id="django_jobqueue.W006",
            )
        )
    return errors


@checks.register(checks.Tags.database)
def check_database(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """E002: MySQL/MariaDB too old for SKIP LOCKED.  W001/W002: SQLite not WAL / not IMMEDIATE."""
    found, usable = conf.examine()
    if any(p.setting.upper() in ("", "DATABASE") for p in found):
        return []  # the queue database is unknown: E001 says why
    using = usable.database
    if not databases or using not in databases:
        return []
    return [*_server_messages(using), *_unhandled_work(using)]


def _unhandled_work(using: str) -> list[checks.CheckMessage]:
    """W005: ready jobs of types that no live worker has a handler for, or started jobs of a
    version of its handler that none has (a deploy left behind)."""
    from django.db import DatabaseError

    from . import versions
    from .models import Job, Worker

    try:
        live = list(Worker.objects.using(using).alive().values_list("handlers", "handler_versions"))
        if not live:
            return []  # no worker to compare with: jobqueue_stats reports that
        known = sorted({key for handlers, _ in live for key in handlers or []})
        waiting = list(
            Job.objects.using(using)
            .filter(state=Job.State.READY)
            .exclude(type__in=known)
            .order_by()
            .values_list("type", flat=True)
            .distinct()[:10]
        )
        unserved = versions.unserved(Job.objects.using(using), versions.live_versions(live))
    except DatabaseError:
        return []  # not migrated yet, or unreachable: other checks and commands say so
    found: list[checks.CheckMessage] = []
    if waiting:
        found.append(
            checks.Warning(
                f"Ready jobs wait for handlers that no live worker has: {', '.join(waiting)}.",
                hint="Deploy workers whose code registers these handlers (a rolling deploy in "
                "progress clears this by itself), or cancel the jobs.",
                id="django_jobqueue.W005",
            )
        )
    if unserved:
        which = ", ".join(
            f"{kind}@{version or '(none)'} ({n})"
            for kind, by_version in unserved.items()
            for version, n in by_version.items()
        )
        found.append(
            checks.Warning(
                f"Started jobs wait for handler versions that no live worker has: {which}.",
                hint="Deploy workers whose code registers these versions again, beside the new "
                "ones, until their jobs are finished (see 'Changing a durable handler safely'), "
                "or cancel the jobs.",
                id="django_jobqueue.W005",
            )
        )
    return found


def _server_messages(using: str) -> list[checks.CheckMessage]:
    try:
        dialect = get_dialect(using)
    except UnsupportedDatabaseError:
        return []  # the worker refuses to start, and says why
    return dialect.system_checks()


@checks.register()
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E010: each entry of JOBQUEUE["SCHEDULES"] must be valid (handler, cron, time zone...)."""
    from . import schedules

    # Checked against the settings without their bad values, which E001 reports.
    _, usable = conf.examine()
    return [
        checks.Error(message, id="django_jobqueue.E010") for message in schedules.problems(usable)
    ]
