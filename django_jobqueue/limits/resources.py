"""What a claim may start: each resource's room, and its lock row. One engine for every limit.

Every limit is a resource (see `spec`): the names of JOBQUEUE["LIMITS"] that jobs use with
`uses=`, and those the engine derives from GROUP_LIMITS, RATE_LIMITS and DYNAMIC_LIMIT
("group:<name>", one unit per job of the group) and QUEUE_LIMITS ("queue:<name>"). A claim
decides, inside its transaction:

- the groups (`open_groups`, before fair share plans the slots): the derived resources of the
  groups with ready work and of the capped queues;
- the candidates (`open`, once the planned groups' best jobs are locked): the resources their
  `uses` name;
- for each, its `Limit` row (made on first use) is locked FOR UPDATE SKIP LOCKED: a claim
  never waits for a resource's row. A row another transaction holds (a concurrent claim of
  the same resource, an operator's session) gives its resource no room in this claim: the
  jobs that use it wait, every other job goes on, and the worker claims again soon without
  them (the candidates' read leaves out a held resource's jobs for HELD_FOR seconds);
- then, in statements after the lock (at READ COMMITTED they see what earlier holders
  committed), its room: its concurrency cap minus the units in flight (a derived resource's:
  the jobs of its group or queue in flight; another's: the `uses` of the jobs in flight), its
  rate minus the units started in its window (`window`, one counter for every rate), none
  while it is closed (`RateLimited`);
- candidates are taken in order while every resource they use has room (`take`), and the
  units of rated resources they started are recorded (`record_starts`).
A limit changed with `jobqueue_limits set` is a `LimitSetting` row; each worker reads those at
most every OVERRIDES_EVERY seconds.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from django.db.models import Count, Q

from ..dialects import Dialect
from ..dialects.base import aware, read_json, seconds
from ..models import Job, Limit
from ..models.functions import DbNow
from . import live, window
from .live import OVERRIDES_EVERY
from .spec import (
    GROUP,
    QUEUE,
    Spec,
    configured,
    derived,
    find,
    group_resource,
    queue_resource,
)

if TYPE_CHECKING:
    from ..conf import JobQueueSettings

# Seconds a claim leaves out the jobs of a resource found without room (or its row held by
# another transaction) before it looks at the resource again.
HELD_FOR = 0.25


@dataclasses.dataclass
class Room:
    """What one claim may still start of one resource."""

    concurrency: int | None  # units that may still go in flight (None: no cap)
    rate: int | None  # units that may still start in the window (None: no rate)
    closed: bool = False
    held: bool = False  # its row is locked by another transaction: no room in this claim

    def fits(self, units: int) -> bool:
        if self.closed or self.held:
            return False
        return all(left is None or units <= left for left in (self.concurrency, self.rate))

    def left(self) -> int | None:
        """The units that may still start (None: no limit)."""
        if self.closed or self.held:
            return 0
        lefts = [n for n in (self.concurrency, self.rate) if n is not None]
        return min(lefts) if lefts else None

    def capped(self, units: int) -> bool:
        """Whether `units` do not fit for want of concurrency room (rather than a closure, a
        rate or a held row): jobs in flight that end give such room back."""
        return not self.held and self.concurrency is not None and units > self.concurrency

    def rate_bound(self, units: int) -> bool:
        """Whether `units` do not fit for want of room in the rate's window."""
        return not self.closed and not self.held and self.rate is not None and units > self.rate

    def take(self, units: int) -> None:
        if self.concurrency is not None:
            self.concurrency -= units
        if self.rate is not None:
            self.rate -= units


class Resources:
    """The limits of one worker: the live changes, and the claim's check of each candidate."""

    def __init__(self, settings: JobQueueSettings) -> None:
        self.limits = configured(settings)  # LIMITS: the resources jobs name in `uses`
        # Every entry, before the live changes: LIMITS' and the derived ones.
        self.settings = {**derived(settings), **self.limits}
        self._specs = dict(self.settings)
        self._specs_until = 0.0
        self._in_flight_sql: dict[Any, tuple[str, list[Any]]] = {}
        self._derived_key: int | None = None
        self._derived_cache: tuple[list[str], list[str]] = ([], [])
        # Resources found with no room, skipped by the next claims until then (monotonic).
        self.full: dict[str, float] = {}
        # Of those, the ones held back by their concurrency cap: a job of this worker that
        # ends may give them room, so they are looked at again then (jobs_ended()).
        self._capped: set[str] = set()
        self._ended = False
        # When (monotonic) to claim again: a rate held back by its window has room, or at once
        # after a claim left jobs behind for a row another transaction held. Set per claim.
        self.retry_at: float | None = None
        # The claim in progress: each resource's room and limits, the rated units it started,
        # the rates' windows as read, the database's time at the lock, the rates that ran out
        # with work left, and whether a derived resource's row was held elsewhere.
        self._rooms: dict[str, Room] = {}
        self._governed: dict[str, Spec] = {}
        self._started: dict[str, int] = {}
        self._windows = window.Started({}, {})
        self._now: dt.datetime | None = None
        self._ran_out: set[str] = set()
        self.held_groups = False

    def __bool__(self) -> bool:
        """Whether jobs' own `uses` are limited (JOBQUEUE["LIMITS"] is not empty)."""
        return bool(self.limits)

    def specs(self, using: str) -> dict[str, Spec]:
        """Every limit with the live changes applied, read at most every second."""
        now = time.monotonic()
        if now >= self._specs_until:
            specs = {**self.settings, **live.changes(using)}
            self._specs, self._specs_until = specs, now + OVERRIDES_EVERY
        return self._specs

    def jobs_ended(self) -> bool:
        """Called when this worker recorded outcomes (from its completer's thread): whether a
        resource held back by its concurrency cap may have room now (then claim again)."""
        if not self._capped:
            return False
        self._ended = True
        return True

    def begin(self) -> list[str]:
        """Start a claim: forget the last one's rooms; return the resources its candidates'
        read need not look at now (found without room a moment ago)."""
        self.retry_at = None
        self._rooms, self._governed, self._started = {}, {}, {}
        self._windows, self._now, self._ran_out = window.Started({}, {}), None, set()
        self.held_groups = False
        if self._ended:  # jobs ended since: the capped ones may have room again
            self._ended = False
            for name in self._capped:
                self.full.pop(name, None)
            self._capped = set()
        now = time.monotonic()
        self.full = {name: until for name, until in self.full.items() if until > now}
        return sorted(self.full)

    # Kept for the callers of before the engine's merge: the same as begin().
    skipped = begin

    # -- the groups, before the plan ----------------------------------------------------------

    def open_groups(
        self,
        dialect: Dialect,
        groups: Iterable[str],
        dynamic: Mapping[str, int | None],
        count: bool,
    ) -> dict[str, int]:
        """Lock and measure the resources derived for `groups` (those with ready work) and for
        every capped queue: `dynamic` holds each group's DYNAMIC_LIMIT cap (None: none).
        Return the jobs in flight of each group, counted after the lock (read when `count`
        or when any group is limited; else {}).

        Each group's room is then `group_room(group)`, each capped queue's `queue_room()`.
        """
        specs = self.specs(dialect.using)
        limited, queue_names = self._derived_specs
        # Only the limited groups are looked at: with a group per tenant there are thousands
        # of groups with ready work, and a few limits.
        governed: dict[str, Spec] = {}
        for group in {*(g for g in limited if g in groups), *dynamic}:
            name = group_resource(group)
            spec = specs.get(name)
            cap = dynamic.get(group)
            if cap is not None:  # the hook's cap and the settings' cap: the smaller one
                static = spec.concurrency if spec is not None else None
                rate = spec.rate if spec is not None else None
                spec = Spec(cap if static is None else min(cap, static), rate)
            if spec is not None:
                governed[name] = spec
        queues = {name: specs[name] for name in queue_names}
        governed.update(queues)
        if not governed and not count:
            return {}
        statements = [self._in_flight_by_group_sql(dialect, bool(queues))]
        names = sorted(governed)
        rated = {name: spec.rate[1] for name, spec in governed.items() if spec.rate}
        if rated:
            statements.append(window.read_sql(dialect, rated))
        rows, now, results = self._lock(dialect, names, statements)
        by_group: dict[str, int] = {}
        by_queue: dict[str, int] = {}
        for row in results[0]:
            by_group[row[0]] = by_group.get(row[0], 0) + row[-1]
            if queues:
                by_queue[row[1]] = by_queue.get(row[1], 0) + row[-1]
        starts = window.count(results[1]) if rated else window.Started({}, {})
        in_flight = {}
        for name in names:
            key = name[len(QUEUE) :] if name in queues else name.partition(":")[2]
            in_flight[name] = (by_queue if name in queues else by_group).get(key, 0)
        self._add_rooms(governed, rows, now, in_flight, starts)
        self.held_groups = any(self._rooms[name].held for name in names)
        return by_group

    @property
    def _derived_specs(self) -> tuple[list[str], list[str]]:
        """The groups and the queue resources that a derived limit names (with the live
        changes), worked out once per read of the changes."""
        specs = self._specs  # read by specs() just before
        key = id(specs)
        if self._derived_key != key:
            groups = [name[len(GROUP) :] for name in specs if name.startswith(GROUP)]
            queues = [name for name in specs if name.startswith(QUEUE)]
            self._derived_cache, self._derived_key = (groups, queues), key
        return self._derived_cache

    def rated_groups(self) -> set[str]:
        """The groups whose derived resource has a rate, in this claim."""
        return {
            name[len(GROUP) :]
            for name, spec in self._governed.items()
            if spec.rate and name.startswith(GROUP)
        }

    def rated(self, uses: Mapping[str, int] | None) -> bool:
        """Whether a job that uses `uses` would count against a rate (after `open()`)."""
        governed = self._governed
        return any(governed[name].rate for name in uses or () if name in governed)

    def rated_units(self, uses: Mapping[str, int] | None, group: str) -> dict[str, int]:
        """The units a job of `group` that uses `uses` counts against rates (after `open()`)."""
        governed = self._governed
        units = {
            name: n for name, n in (uses or {}).items() if name in governed and governed[name].rate
        }
        spec = governed.get(group_resource(group))
        if spec is not None and spec.rate:
            units[group_resource(group)] = 1
        return units

    def group_rooms(self) -> dict[str, int | None]:
        """The jobs each limited group may still start in this claim (absent: no limit)."""
        return {
            name[len(GROUP) :]: room.left()
            for name, room in self._rooms.items()
            if name.startswith(GROUP) and name in self._governed
        }

    def queue_room(self) -> dict[str, int]:
        """The jobs each capped queue may still start in this claim."""
        return {
            name[len(QUEUE) :]: room.left() or 0
            for name, room in self._rooms.items()
            if name.startswith(QUEUE) and name in self._governed
        }

    def _in_flight_by_group_sql(self, dialect: Dialect, by_queue: bool) -> tuple[str, list[Any]]:
        """The jobs in flight of each group (and queue), across all workers: one small
        statement, compiled by the ORM once (building and compiling it cost twice its run)."""
        key = (dialect.using, by_queue)
        if key not in self._in_flight_sql:
            fields = ("group_key", "queue") if by_queue else ("group_key",)
            query = (
                Job.objects.using(dialect.using)
                .in_flight()
                .values_list(*fields)
                .annotate(n=Count("pk"))
                .values_list(*fields, "n")
            )
            self._in_flight_sql[key] = dialect.compile_query(query)
        return self._in_flight_sql[key]

    # -- the candidates -----------------------------------------------------------------------

    def open(self, dialect: Dialect, uses: Iterable[Mapping[str, int] | None]) -> None:
        """Lock the rows of the resources that `uses` name, and compute each one's room.

        Runs in the claim transaction, after the candidate jobs were locked (SKIP LOCKED);
        `take()` then admits them one by one, in the order the claim would take them.
        """
        names = sorted({name for used in uses for name in used or ()} - self._rooms.keys())
        if not names:
            return
        specs = self.specs(dialect.using)
        governed = {name: found[1] for name in names if (found := find(name, specs))}
        # A resource that LIMITS no longer names has no limit: its jobs are not held back.
        for name in names:
            if name not in governed:
                self._rooms[name] = Room(None, None)
        if not governed:
            return
        capped = sorted(name for name, spec in governed.items() if spec.concurrency is not None)
        rated = {name: spec.rate[1] for name, spec in governed.items() if spec.rate}
        statements = []
        if capped:
            statements.append(dialect.uses_in_flight_sql(capped))
        if rated:
            statements.append(window.read_sql(dialect, rated))
        rows, now, results = self._lock(dialect, sorted(governed), statements)
        if rated and now is None:  # every row held elsewhere: a rate's reopening needs a clock
            now = dialect.now()
        in_flight = _units([read_json(u) for (u,) in results[0]] if capped else [], capped)
        starts = window.count(results[-1]) if rated else window.Started({}, {})
        self._add_rooms(governed, rows, now, in_flight, starts)

    def _add_rooms(
        self,
        governed: Mapping[str, Spec],
        rows: list[tuple[str, dt.datetime | None]],
        now: dt.datetime | None,
        in_flight: Mapping[str, int],
        starts: window.Started,
    ) -> None:
        closed = {name for name, until in rows if until and now and until > now}
        locked = {name for name, _ in rows}
        for name, spec in governed.items():
            concurrency = None
            if spec.concurrency is not None:
                concurrency = max(0, spec.concurrency - in_flight.get(name, 0))
            rate = None if spec.rate is None else max(0, spec.rate[0] - starts.units.get(name, 0))
            self._rooms[name] = Room(concurrency, rate, name in closed, name not in locked)
        self._governed.update(governed)
        self._windows.units.update(starts.units)
        self._windows.first.update(starts.first)
        self._now = now or self._now

    def _lock(
        self, dialect: Dialect, names: list[str], statements: list[tuple[str, list[Any]]]
    ) -> tuple[list[tuple[str, dt.datetime | None]], dt.datetime | None, list[list[Any]]]:
        """Lock the `Limit` rows of `names` that no other transaction holds (made first if
        missing), without waiting, then run `statements`, each after the lock (one round trip
        where the database allows). Return the rows locked (name, closed_until), the
        database's time at the lock (None: no row locked), and each statement's rows."""
        # A resource has its row from its first claim on: then this is one round trip. A name
        # not locked has no row yet, or another transaction holds it: a read that takes no
        # lock tells which (an INSERT of a held row would wait for its holder on MySQL). Rows
        # missing are made (ignoring those another claim made meanwhile) and all are locked
        # again, the statements run after that lock.
        lock = [dialect.lock_resources_sql(names)] if names else []
        results = dialect.execute_together([*lock, *statements])
        if names and len(results[0]) < len(names):
            found = {row[0] for row in results[0]}
            missing = [name for name in names if name not in found]
            if make_rows(dialect, missing):
                results = dialect.execute_together([*lock, *statements])
        rows = results[0] if names else []
        now = aware(rows[0][2]) if rows else None
        locked = [(name, aware(until) if until else None) for name, until, _ in rows]
        return locked, now, results[len(lock) :]

    def take(self, uses: Mapping[str, int] | None, group: str = "", queue: str = "") -> bool:
        """Whether a job of `group` and `queue` that uses `uses` may start now; if so, count
        its units (and one of its group's and queue's derived resources) as taken."""
        rooms = self._rooms
        wanted = dict(uses or {})
        for derived_name in (group_resource(group), queue_resource(queue)):
            if derived_name in rooms:
                wanted[derived_name] = 1
        if not wanted:
            return True
        blocked = [n for n, units in wanted.items() if n not in rooms or not rooms[n].fits(units)]
        if blocked:
            now = time.monotonic()
            own = [n for n in blocked if uses and n in uses]  # the candidates' read skips them
            self.full.update(dict.fromkeys(own, now + min(HELD_FOR, OVERRIDES_EVERY)))
            self._capped.update(n for n in own if n in rooms and rooms[n].capped(wanted[n]))
            self._ran_out.update(
                n for n in blocked if n in rooms and rooms[n].rate_bound(wanted[n])
            )
            if any(n in rooms and rooms[n].held for n in own):
                # Held by another transaction: claim again at once without this resource's
                # jobs, so that the others' jobs behind them start now, not at the next poll.
                self.retry_at = now
            return False
        for name, units in wanted.items():
            rooms[name].take(units)
            if name in self._governed and self._governed[name].rate:
                self._started[name] = self._started.get(name, 0) + units
        return True

    def took(self, rows: Iterable[tuple[int, str, str]]) -> None:
        """Take the units of derived resources of `rows` ((id, queue, group) of jobs a claim
        took without `take()`: fair share's plan kept them within their groups' room)."""
        for _, queue, group in rows:
            for name in (group_resource(group), queue_resource(queue)):
                room = self._rooms.get(name)
                if room is not None:
                    room.take(1)
                    if self._governed[name].rate:
                        self._started[name] = self._started.get(name, 0) + 1

    def settle_claim(self, wanting: Mapping[str, int], taken: Mapping[str, int]) -> None:
        """At the end of a claim: note when a rate that ran out with work left has room again
        (`retry_at`). `wanting` and `taken`: each group's ready jobs, and those this claim
        took (a group rate ran out when its room is used up and jobs are left)."""
        for group, ready in wanting.items():
            room = self._rooms.get(group_resource(group))
            used_up = room is not None and room.rate is not None and room.rate <= 0
            if used_up and ready > taken.get(group, 0):
                self._ran_out.add(group_resource(group))
        now = self._now
        if now is None:
            return
        for name in self._ran_out:
            spec = self._governed.get(name)
            if spec is not None and spec.rate:
                reopens = self._windows.reopens(name, spec.rate[1], now)
                soonest = time.monotonic() + reopens + 0.001
                self.retry_at = soonest if self.retry_at is None else min(self.retry_at, soonest)

    def started(self) -> bool:
        """Whether the last claim took rate-limited units, which `record_starts` records."""
        return bool(self._started)

    def record_starts(
        self, dialect: Dialect, spent: Mapping[tuple[str, str], int] | None = None
    ) -> dt.datetime | None:
        """Count the rate-limited units the last claim started, at a clock read after the
        claim stamped its jobs (so two batches the limiter held a window apart are at least
        that far apart in the jobs' own `started_at`), and forget old windows. Return the
        database's time of the count (None: nothing to count)."""
        periods = {name: spec.rate[1] for name, spec in self._governed.items() if spec.rate}
        at = window.record(dialect, self._started, periods, spent)
        self._started = {}
        return at


def _units(uses: Iterable[Mapping[str, int] | None], names: list[str]) -> dict[str, int]:
    """The units of each resource of `names` that the jobs of `uses` (those in flight) hold."""
    wanted, units = set(names), dict[str, int]()
    for used in uses:
        for name, n in (used or {}).items():
            if name in wanted:
                units[name] = units.get(name, 0) + n
    return units


def make_rows(dialect: Dialect, names: list[str]) -> list[str]:
    """Make the `Limit` rows of `names` that are missing (read first without a lock: on MySQL
    an INSERT IGNORE of an existing row takes a shared lock on it, which two transactions that
    then lock it for update turn into a deadlock). Return the names that had none."""
    new = sorted(set(names) - dialect.existing_resources(names))
    if new:
        Limit.objects.using(dialect.using).bulk_create(
            [Limit(name=name) for name in new], ignore_conflicts=True
        )
    return new


def close(dialect: Dialect, name: str, retry_after: float) -> None:
    """Close resource `name` for `retry_after` seconds (from the database's now): no claim
    starts a job that uses it until then. A later reopening time wins."""
    using = dialect.using
    make_rows(dialect, [name])
    until = DbNow() + seconds(retry_after)
    Limit.objects.using(using).filter(name=name).filter(
        Q(closed_until__isnull=True) | Q(closed_until__lt=until)
    ).update(closed_until=until)
