"""The one sliding-window counter of every rate: the units a resource started in any window of
its period, whichever limit declared the rate (a LIMITS entry's, or a RATE_LIMITS group's) and
however they were taken (a claim's `uses`, a running job's `ctx.acquire()`).

Each claim that starts units of a rated resource records one row (`ResourceStart`: the
resource, the database clock's time, the units), and so does each grant of `ctx.acquire()`; a
claim or a grant may take only what the rows of the last window leave room for. A settlement
(`ctx.settle()`) adds a row at its grant's time with what it changed (used minus granted), so
that it counts in the windows of its grant, and a job handed back unstarted one of its units,
negative. The time of a claim's row is read after the claim stamped its jobs' `started_at`,
so it is never earlier than their stamps, and every row is written inside the transaction
that holds the resource's lock row, so that claims and grants in every process and host count
each other's.

A claim's row is held in the windows MARGIN longer than its period: a handler starts a little
after its claim recorded the start, and not always the same little, so two batches recorded
exactly one period apart could otherwise start in their handlers a little less than a period
apart (the worker starts each within MARGIN / 2 of the count, or hands it back). A grant's
row is written at the moment the handler takes its units, and is held for the period only:
in any window of the period the units started, at claims and in handlers, never exceed the
rate, and a budget's grants can use all of it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from django.db.models import Q, Sum

from ..dialects import Dialect
from ..dialects.base import aware, seconds
from ..models import MinuteSpend, ResourceStart
from ..models.functions import DbNow
from .spec import RATE_PERIODS, Spec, find

MARGIN = 0.1  # seconds added to each window, for the spread between claim and handler start


# The kinds of rows at a claim's time, held MARGIN longer (see above).
AT_CLAIM = (ResourceStart.Kind.START, ResourceStart.Kind.BACK, ResourceStart.Kind.USETTLE)


def length(period: int, kind: str = ResourceStart.Kind.START) -> dt.timedelta:
    """How far back a window of `period` seconds reaches for a row of `kind`: the period, and
    the margin for rows at a claim's time."""
    return dt.timedelta(seconds=period + (MARGIN if kind in AT_CLAIM else 0.0))


def _held(dialect: Dialect, period: int) -> tuple[str, list[Any]]:
    """SQL true for a row of a resource of `period` that its window still holds now (compiled
    once a period: every grant and every claim under a rate reads its window)."""
    key = ("window_held", period)
    if key not in dialect._sql_cache:
        longer, longer_params = dialect.compile(DbNow() - length(period))
        shorter, shorter_params = dialect.compile(
            DbNow() - length(period, ResourceStart.Kind.GRANT)
        )
        kinds = ", ".join(f"'{kind}'" for kind in AT_CLAIM)
        sql = f"started_at > {longer} AND (kind IN ({kinds}) OR started_at > {shorter})"
        dialect._sql_cache[key] = (sql, [*longer_params, *shorter_params])
    sql, params = dialect._sql_cache[key]
    return sql, list(params)


class Started(NamedTuple):
    """The units each rated resource started in its window, and its oldest start there."""

    units: dict[str, int]
    first: dict[str, dt.datetime]

    def reopens(self, name: str, period: int, now: dt.datetime) -> float:
        """Seconds from `now` until the oldest start of `name`'s window leaves it (now, if
        the window holds none yet: then the starts of this claim open it)."""
        first = self.first.get(name, now)
        return max(0.0, (first + length(period) - now).total_seconds())


def read_sql(dialect: Dialect, periods: Mapping[str, int]) -> tuple[str, list[Any]]:
    """The statement summing, in the database, the units each resource of `periods` ({name:
    period}) started in its window by the database's clock: (resource, units, oldest start).

    One aggregate per period the resources have (usually one), joined by UNION ALL: a day's
    window may hold thousands of rows, which the database sums through its index.
    """
    table = dialect.qn(ResourceStart._meta.db_table)
    by_period: dict[int, list[str]] = {}
    for name, period in sorted(periods.items()):
        by_period.setdefault(period, []).append(name)
    parts, params = [], []
    for period, names in sorted(by_period.items()):
        named, named_params = dialect.in_sql("resource", names)
        held, held_params = _held(dialect, period)
        parts.append(
            f"SELECT resource, SUM(units), MIN(started_at) FROM {table} "
            f"WHERE {named} AND {held} GROUP BY resource"
        )
        params += [*named_params, *held_params]
    return " UNION ALL ".join(parts), params


def count(rows: Iterable[tuple[Any, ...]]) -> Started:
    """The rows of `read_sql` as Started."""
    units: dict[str, int] = {}
    first: dict[str, dt.datetime] = {}
    for name, total, oldest in rows:
        units[name] = int(total or 0)
        if oldest is not None:
            first[name] = aware(oldest)
    return Started(units, first)


def read(dialect: Dialect, periods: Mapping[str, int]) -> Started:
    """The units each resource of `periods` started in its window ending now."""
    if not periods:
        return Started({}, {})
    sql, params = read_sql(dialect, periods)
    with dialect.cursor() as cursor:
        cursor.execute(sql, params)
        return count(cursor.fetchall())


def by_kind(dialect: Dialect, periods: Mapping[str, int]) -> dict[str, dict[str, int]]:
    """What the window of each resource of `periods` holds, by kind: {resource: {"granted":
    units started by claims and granted by `ctx.acquire()`, "settled": units the settlements
    of its grants said were used, "net": what the rate counts}} (for operators)."""
    if not periods:
        return {}
    found: dict[str, dict[str, int]] = {}
    rows = ResourceStart.objects.using(dialect.using)
    by_period: dict[int, list[str]] = {}
    for name, period in periods.items():
        by_period.setdefault(period, []).append(name)
    for period, names in by_period.items():
        held = Q(kind__in=AT_CLAIM) | Q(
            started_at__gt=DbNow() - length(period, ResourceStart.Kind.GRANT)
        )
        for name, kind, units, used in (
            rows.filter(held, resource__in=names, started_at__gt=DbNow() - length(period))
            .values_list("resource", "kind")
            .annotate(n=Sum("units"), u=Sum("used"))
            .values_list("resource", "kind", "n", "u")
        ):
            entry = found.setdefault(name, {"granted": 0, "settled": 0, "net": 0})
            entry["net"] += units or 0
            if kind in (ResourceStart.Kind.START, ResourceStart.Kind.GRANT):
                entry["granted"] += units or 0
            elif kind in (ResourceStart.Kind.SETTLE, ResourceStart.Kind.USETTLE):
                entry["settled"] += used or 0
    return found


def reopens_at(
    dialect: Dialect, name: str, period: int, needed: int, now: dt.datetime
) -> dt.datetime:
    """When enough of `name`'s window will have left it for `needed` more units to fit (the
    rows read oldest first; a window that never frees enough: when its last row leaves)."""
    rows = ResourceStart.objects.using(dialect.using).filter(
        resource=name, started_at__gt=now - length(period)
    )
    leaving = sorted(
        (aware(at) + length(period, kind), units)
        for at, units, kind in rows.values_list("started_at", "units", "kind")
    )
    freed, leaves = 0, now
    for leaves, units in leaving:
        if leaves <= now:
            continue  # left already (a grant's row older than its period)
        freed += units
        if freed >= needed:
            break
    return max(leaves, now)


def record(
    dialect: Dialect,
    started: Mapping[str, int],
    periods: Mapping[str, int],
    spent: Mapping[tuple[str, str], int] | None = None,
) -> dt.datetime | None:
    """Record the units `started` of each rated resource at the database's clock read now,
    and their spend by handler (`spent`: {(resource, handler): units}); forget the rows of
    those resources that left their windows; return that time (None: none started)."""
    started = {name: units for name, units in started.items() if units}
    if not started:
        return None
    now = dialect.now()
    rows = ResourceStart.objects.using(dialect.using)
    rows.bulk_create(
        ResourceStart(resource=name, started_at=now, units=units)
        for name, units in sorted(started.items())
    )
    old = Q()
    for name in sorted(started):
        old |= Q(resource=name, started_at__lte=now - seconds(periods[name] + MARGIN))
    rows.filter(old).delete()
    if spent:
        add_spend(dialect, now, spent)
    return now


def add(
    dialect: Dialect,
    name: str,
    at: dt.datetime,
    units: int,
    kind: str,
    *,
    used: int | None = None,
    handler: str | None = None,
    now: dt.datetime | None = None,
) -> None:
    """Write one row of `name`'s window at `at` (a grant, a settlement, a give-back), and the
    units' spend by `handler` in the minute of `now` (the database's time of the write)."""
    ResourceStart.objects.using(dialect.using).create(
        resource=name, started_at=at, units=units, kind=kind, used=used
    )
    if handler is not None and units:
        add_spend(dialect, now or at, {(name, handler): units})


def forget(dialect: Dialect, specs: Mapping[str, Spec]) -> int:
    """Delete the rows that every window has left: of each resource, those older than its
    rate's period and the margin (of a resource no longer rated, than the longest period).
    A claim forgets its resources' old rows as it records (`record`); grants and settlements
    do not, so the recorder calls this once a minute. Return the rows deleted."""
    rows = ResourceStart.objects.using(dialect.using)
    longest = max(RATE_PERIODS.values())
    by_period: dict[int, list[str]] = {}
    for name in rows.order_by().values_list("resource", flat=True).distinct():
        found = find(name, specs)
        rate = found[1].rate if found else None
        by_period.setdefault(rate[1] if rate else longest, []).append(name)
    now, deleted = dialect.now(), 0
    for period, names in sorted(by_period.items()):
        for start in range(0, len(names), 500):
            chunk = names[start : start + 500]
            old = rows.filter(resource__in=chunk, started_at__lte=now - length(period))
            deleted += old.delete()[0]
    return deleted


def add_sql(
    dialect: Dialect,
    name: str,
    at: dt.datetime,
    units: int,
    kind: str,
    lease: tuple[int, str, int],
    *,
    used: int | None = None,
    handler: str | None = None,
) -> list[tuple[str, list[Any]]]:
    """The statements of `add` (the spend in the minute of `at`), each of which writes only
    while `lease` (job id, owner, attempt) is current: to run after the record they go with
    (`Dialect.write_together`)."""
    row = {"resource": name, "started_at": at, "units": units, "kind": kind, "used": used}
    statements = [dialect.fenced_insert_sql(ResourceStart, row, lease)]
    if handler is not None and units:
        spend = {"minute": _minute(at), "resource": name, "handler": handler, "units": units}
        statements.append(
            dialect.fenced_insert_sql(
                MinuteSpend, spend, lease, add_to=(("minute", "resource", "handler"), "units")
            )
        )
    return statements


def give_back(
    dialect: Dialect, units: Iterable[tuple[Mapping[str, int], dt.datetime, str | None]]
) -> None:
    """Give back units that were counted but never started (a job handed back before its
    handler ran): a row of each resource's units, negative, at the time they were counted, so
    that every window that counted them counts them no more. `units`: (counted, at, handler)."""
    rows: list[ResourceStart] = []
    spent: dict[tuple[str, str], int] = {}
    for counted, at, handler in units:
        for name, n in sorted(counted.items()):
            if n:
                rows.append(
                    ResourceStart(
                        resource=name, started_at=at, units=-n, kind=ResourceStart.Kind.BACK
                    )
                )
                if handler is not None:
                    spent[(name, handler)] = spent.get((name, handler), 0) - n
    if rows:
        ResourceStart.objects.using(dialect.using).bulk_create(rows)
        add_spend(dialect, dialect.now(), spent)


def add_spend(dialect: Dialect, now: dt.datetime, spent: Mapping[tuple[str, str], int]) -> None:
    """Add `spent` ({(resource, handler): units}) to the minute of `now` (an upsert each)."""
    minute = _minute(now)
    dialect.add_to_minutes(
        MinuteSpend, ("minute", "resource", "handler"), "units",
        [((minute, name, handler), units) for (name, handler), units in sorted(spent.items())
         if units],
    )  # fmt: skip


def _minute(at: dt.datetime) -> dt.datetime:
    return at.astimezone(dt.UTC).replace(second=0, microsecond=0)
