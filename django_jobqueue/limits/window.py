"""The one sliding-window counter of every rate: the units a resource started in any window of
its period, whichever limit declared the rate (a LIMITS entry's, or a RATE_LIMITS group's).

Each claim that starts units of a rated resource records one row (`ResourceStart`: the
resource, the database clock's time, the units), and a claim may start only what the rows of
the last window leave room for. The time is read after the claim stamped its jobs'
`started_at` (`record`), so it is never earlier than their stamps, and both happen inside the
claim transaction under the resource's lock row, so claims in every process and host count
each other's starts.

The window is held MARGIN longer than its period: a handler starts a little after its claim
recorded the start, and not always the same little, so two batches recorded exactly one
period apart could otherwise start in their handlers a little less than a period apart.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from django.db.models import Q

from ..dialects import Dialect
from ..dialects.base import aware, seconds
from ..dialects.functions import DbNow
from ..models import ResourceStart

MARGIN = 0.1  # seconds added to each window, for the spread between claim and handler start


def length(period: int) -> dt.timedelta:
    """How far back a window of `period` seconds reaches (its period and the margin)."""
    return dt.timedelta(seconds=period + MARGIN)


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
    """The statement reading the starts of the resources of `periods` ({name: period}) back to
    the longest of their windows, by the database's clock: (resource, started_at, units)."""
    names = sorted(periods)
    named, params = dialect.in_sql("resource", names)
    cutoff, cutoff_params = dialect.compile(DbNow() - length(max(periods.values())))
    table = dialect.qn(ResourceStart._meta.db_table)
    sql = f"SELECT resource, started_at, units FROM {table} WHERE {named} AND started_at > {cutoff}"
    return sql, [*params, *cutoff_params]


def count(rows: Iterable[Sequence[Any]], periods: Mapping[str, int], now: dt.datetime) -> Started:
    """Sum the rows of `read_sql` within each resource's own window ending at `now`."""
    units: dict[str, int] = {}
    first: dict[str, dt.datetime] = {}
    for name, at, n in rows:
        at = aware(at)
        if at > now - length(periods[name]):
            units[name] = units.get(name, 0) + n
            if name not in first or at < first[name]:
                first[name] = at
    return Started(units, first)


def read(dialect: Dialect, periods: Mapping[str, int], now: dt.datetime) -> Started:
    """The units each resource of `periods` started in its window ending at `now`."""
    if not periods:
        return Started({}, {})
    sql, params = read_sql(dialect, periods)
    with dialect.cursor() as cursor:
        cursor.execute(sql, params)
        return count(cursor.fetchall(), periods, now)


def record(
    dialect: Dialect, started: Mapping[str, int], periods: Mapping[str, int]
) -> dt.datetime | None:
    """Record the units `started` of each rated resource at the database's clock read now, and
    forget the rows of those resources that left their windows; return that time (None: none
    started)."""
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
    return now


def give_back(dialect: Dialect, units: Iterable[tuple[Mapping[str, int], dt.datetime]]) -> None:
    """Give back units that were counted but never started (a job handed back before its
    handler ran): one row of each resource's units, negative, at the time they were counted,
    so that every window that counted them counts them no more."""
    rows = [
        ResourceStart(resource=name, started_at=at, units=-n)
        for counted, at in units
        for name, n in sorted(counted.items())
        if n
    ]
    if rows:
        ResourceStart.objects.using(dialect.using).bulk_create(rows)
