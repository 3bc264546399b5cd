"""What a claim may start under JOBQUEUE["LIMITS"]: each resource's room, and its lock.

How a claim decides (`Resources.open` and `take`, inside the claim transaction; see `limits`
for what the settings and `uses` say):
- the candidate jobs, already locked (SKIP LOCKED), name their resources;
- the `Limit` row of each resource (made on first use) is locked FOR UPDATE, in name order:
  a claim waits only for claims of jobs that use one of the same resources, never for those
  of another tenant's;
- a resource's room: its concurrency cap minus the units of the jobs in flight that use it
  (read from those jobs' rows), its rate minus the units started in its window
  (`ResourceStart` rows), none while it is closed (`RateLimited`);
- candidates are taken in order while every resource they use has room for their units.
A limit changed with `jobqueue_limits set` is a `LimitSetting` row; each worker reads those
at most every OVERRIDES_EVERY seconds.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Iterable, Mapping
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db.models import Q

from .dialects import Dialect
from .dialects.base import LockedResources, seconds
from .dialects.functions import DbNow
from .limits import Spec, find, parse_limits, parse_spec
from .models import Limit, LimitSetting, ResourceStart

# Seconds a worker reuses the live changes it read (`jobqueue_limits set`): they apply within
# about twice this.
OVERRIDES_EVERY = 1.0
# The window of a rate is held this much longer than its period (see ratelimits.MARGIN).
MARGIN = 0.1


@dataclasses.dataclass
class Room:
    """What one claim may still start of one resource."""

    concurrency: int | None  # units that may still go in flight (None: no cap)
    rate: int | None  # units that may still start in the window (None: no rate)
    closed: bool = False

    def fits(self, units: int) -> bool:
        if self.closed:
            return False
        return all(left is None or units <= left for left in (self.concurrency, self.rate))

    def capped(self, units: int) -> bool:
        """Whether `units` do not fit for want of concurrency room (rather than a closure or
        a rate): jobs in flight that end give such room back."""
        return self.concurrency is not None and units > self.concurrency

    def take(self, units: int) -> None:
        if self.concurrency is not None:
            self.concurrency -= units
        if self.rate is not None:
            self.rate -= units


class Resources:
    """The LIMITS of one worker: the live changes, and the claim's check of each candidate."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.settings = parse_limits(dict(raw))
        self._specs = dict(self.settings)
        self._specs_until = 0.0
        # Resources found with no room, skipped by the next claims until then (monotonic).
        self.full: dict[str, float] = {}
        # Of those, the ones held back by their concurrency cap: a job of this worker that
        # ends may give them room, so they are looked at again then (jobs_ended()).
        self._capped: set[str] = set()
        self._ended = False
        self.retry_at: float | None = None  # when a rate held back by its window has room
        # The claim in progress: each resource's room, its limits, the rate-limited units taken.
        self._rooms: dict[str, Room] = {}
        self._governed: dict[str, Spec] = {}
        self._started: dict[str, int] = {}

    def __bool__(self) -> bool:
        return bool(self.settings)

    def specs(self, using: str) -> dict[str, Spec]:
        """The settings' LIMITS with the live changes applied, read at most every second."""
        now = time.monotonic()
        if now >= self._specs_until:
            specs = dict(self.settings)
            for name, concurrency, rate in LimitSetting.objects.using(using).values_list(
                "name", "concurrency", "rate"
            ):
                value = {"concurrency": concurrency, "rate": rate or None}
                try:
                    specs[name] = parse_spec(name, {k: v for k, v in value.items() if v})
                except ImproperlyConfigured:
                    continue  # written by hand, badly: the settings' value holds
            self._specs, self._specs_until = specs, now + OVERRIDES_EVERY
        return self._specs

    def jobs_ended(self) -> bool:
        """Called when this worker recorded outcomes (from its completer's thread): whether a
        resource held back by its concurrency cap may have room now (then claim again)."""
        if not self._capped:
            return False
        self._ended = True
        return True

    def skipped(self) -> list[str]:
        """The resources a claim need not look at now (found without room a moment ago)."""
        if self._ended:  # jobs ended since: the capped ones may have room again
            self._ended = False
            for name in self._capped:
                self.full.pop(name, None)
            self._capped = set()
        now = time.monotonic()
        self.full = {name: until for name, until in self.full.items() if until > now}
        return sorted(self.full)

    def open(self, dialect: Dialect, uses: Iterable[Mapping[str, int] | None]) -> None:
        """Lock the rows of the resources that `uses` name, and compute each one's room.

        Runs in the claim transaction, after the candidate jobs were locked (SKIP LOCKED);
        `take()` then admits them one by one, in the order the claim would take them.
        """
        names = sorted({name for used in uses for name in used or ()})
        self._rooms, self._governed, self._started = {}, {}, {}
        if not names:
            return
        specs = self.specs(dialect.using)
        self._governed = {name: found[1] for name in names if (found := find(name, specs))}
        self._rooms = self._compute_rooms(dialect, self._governed)
        # A resource that LIMITS no longer names has no limit: its jobs are not held back.
        for name in names:
            if name not in self._governed:
                self._rooms[name] = Room(None, None)

    def rated(self, uses: Mapping[str, int] | None) -> bool:
        """Whether a job that uses `uses` would count against a rate (after `open()`)."""
        governed = self._governed
        return any(governed[name].rate for name in uses or () if name in governed)

    def take(self, uses: Mapping[str, int] | None) -> bool:
        """Whether a job that uses `uses` may start now; if so, count its units as taken."""
        if not uses:
            return True
        rooms = self._rooms
        blocked = [n for n, units in uses.items() if n not in rooms or not rooms[n].fits(units)]
        if blocked:
            refill = time.monotonic() + min(0.25, OVERRIDES_EVERY)
            self.full.update(dict.fromkeys(blocked, refill))
            self._capped.update(n for n in blocked if n in rooms and rooms[n].capped(uses[n]))
            return False
        for name, units in uses.items():
            rooms[name].take(units)
            if name in self._governed and self._governed[name].rate:
                self._started[name] = self._started.get(name, 0) + units
        return True

    def _compute_rooms(self, dialect: Dialect, governed: Mapping[str, Spec]) -> dict[str, Room]:
        capped = sorted(name for name, spec in governed.items() if spec.concurrency is not None)
        rows, now, uses = self._lock(dialect, sorted(governed), capped)
        closed = {name for name, until in rows if until and until > now}
        in_flight = _units(uses, capped)
        rated = {name: spec.rate for name, spec in governed.items() if spec.rate}
        started = self._started_in_windows(dialect.using, rated, now)
        rooms = {}
        for name, spec in governed.items():
            concurrency = None
            if spec.concurrency is not None:
                concurrency = max(0, spec.concurrency - in_flight.get(name, 0))
            rate = None if spec.rate is None else max(0, spec.rate[0] - started.get(name, 0))
            rooms[name] = Room(concurrency, rate, name in closed)
        return rooms

    def _lock(self, dialect: Dialect, names: list[str], capped: list[str]) -> LockedResources:
        """Lock the `Limit` rows of `names` (made first if missing), in name order, blocking:
        a second claim of the same resource waits, then counts what the first one started.
        Return each row's (name, closed_until), the database's time at the lock, and the
        `uses` of the jobs in flight that use a resource of `capped` (read after the lock)."""
        # A resource has its row from its first claim on: then this is one round trip. Rows
        # found missing are made (ignoring those another claim made meanwhile) and all are
        # locked again. A rare deadlock among claims making rows is retried (is_transient).
        locked = dialect.lock_resources(names, capped)
        if len(locked.rows) < len(names):
            found = {row[0] for row in locked.rows}
            Limit.objects.using(dialect.using).bulk_create(
                [Limit(name=name) for name in names if name not in found], ignore_conflicts=True
            )
            locked = dialect.lock_resources(names, capped)
        return locked

    def _started_in_windows(
        self, using: str, rated: Mapping[str, tuple[int, int]], now: dt.datetime
    ) -> dict[str, int]:
        """The units each rate-limited resource started in its window (one query for all)."""
        if not rated:
            return {}
        windows = {name: dt.timedelta(seconds=rate[1] + MARGIN) for name, rate in rated.items()}
        rows = ResourceStart.objects.using(using).filter(
            resource__in=sorted(rated), started_at__gt=now - max(windows.values())
        )
        started: dict[str, int] = {}
        first: dict[str, dt.datetime] = {}
        for name, at, units in rows.order_by("started_at").values_list(
            "resource", "started_at", "units"
        ):
            if at > now - windows[name]:
                started[name] = started.get(name, 0) + units
                first.setdefault(name, at)
        for name, (cap, _) in rated.items():
            if started.get(name, 0) >= cap and name in first:
                reopens = (first[name] + windows[name] - now).total_seconds()
                soonest = time.monotonic() + max(0.0, reopens) + 0.001
                self.retry_at = soonest if self.retry_at is None else min(self.retry_at, soonest)
        return started

    def started(self) -> bool:
        """Whether the last claim took rate-limited units, which `record_starts` records."""
        return bool(self._started)

    def record_starts(self, dialect: Dialect) -> None:
        """Count the rate-limited units the last claim started, at a clock read after the
        claim stamped its jobs (see FairShare.record_starts), and forget old windows."""
        if not self._started:
            return
        now = dialect.now()
        starts = ResourceStart.objects.using(dialect.using)
        starts.bulk_create(
            ResourceStart(resource=name, started_at=now, units=units)
            for name, units in sorted(self._started.items())
        )
        specs = self.specs(dialect.using)
        for name in self._started:
            found = find(name, specs)
            if found and found[1].rate:
                period = found[1].rate[1] + MARGIN
                starts.filter(resource=name, started_at__lte=now - seconds(period)).delete()
        self._started = {}


def _units(uses: Iterable[Mapping[str, int] | None], names: list[str]) -> dict[str, int]:
    """The units of each resource of `names` that the jobs of `uses` (those in flight) hold."""
    wanted, units = set(names), dict[str, int]()
    for used in uses:
        for name, n in (used or {}).items():
            if name in wanted:
                units[name] = units.get(name, 0) + n
    return units


def close(dialect: Dialect, name: str, retry_after: float) -> None:
    """Close resource `name` for `retry_after` seconds (from the database's now): no claim
    starts a job that uses it until then. A later reopening time wins."""
    using = dialect.using
    Limit.objects.using(using).bulk_create([Limit(name=name)], ignore_conflicts=True)
    until = DbNow() + seconds(retry_after)
    Limit.objects.using(using).filter(name=name).filter(
        Q(closed_until__isnull=True) | Q(closed_until__lt=until)
    ).update(closed_until=until)
