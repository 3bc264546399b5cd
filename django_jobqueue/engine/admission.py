"""What the limits and pauses admit into a claim: the limits orchestrator of fair share.

Every limit (`LIMITS` and `uses`, and `GROUP_LIMITS`, `QUEUE_LIMITS`, `RATE_LIMITS` and
`DYNAMIC_LIMIT` as the resources they derive) is counted by the one limits engine
(`limits.resources`); `Admission` drives it from inside a claim transaction, for the fair
share (`fair_selection.FairShare`, which is an `Admission`) that plans the slots:

- the rows of the limits a claim's candidates use are locked once, in name order, before any
  room is read, so no two workers can both see room for the same last slot, and a claim never
  waits for a limit's row while holding another out of order;
- under `LIMITS`, a group's candidates are taken in turn while the resources they use have
  room; a job counted against a rate is taken only into a free slot (`rated_room`), so that it
  starts at once, and its start is counted after its row is stamped `started_at`;
- the `DYNAMIC_LIMIT` hook is asked before the claim transaction begins: a slow hook holds no
  lock and no open transaction, and a hook that raises starts nothing it governs;
- the paused queues, resources and workflows are read at most every FAIR_SHARE_REFRESH (a
  claim's only cost of a pause).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from django.utils.module_loading import import_string

from .. import pausing
from ..dialects.base import read_json
from ..limits.resources import Resources
from ..models import JobQuerySet, Limit
from . import quarantine
from .slot_split import Demand, plan

if TYPE_CHECKING:
    from ..conf import JobQueueSettings
    from ..dialects import Dialect
    from ..lease_results import ClaimedJob

# The name of the module the limits were orchestrated in first: users configure their logging
# by logger name.
logger = logging.getLogger("django_jobqueue.scheduling")
# Under LIMITS, a group's candidates are its best ready jobs, `f` times its slots and `f` more:
# some may use a resource that has no room. `f` adapts between 1 and OVERFETCH: it doubles
# after a claim that refusals left short of its slots, and comes down by one after a claim
# that refused none, or left half its candidates unused. Each candidate costs its row's
# lock, the lock of its resources' rows and their count: with every resource free, a claim
# of 10 locking 44 rows cost PostgreSQL about a third more than one locking 11.
OVERFETCH = 4
# Seconds a group none of whose candidates could start stays out of the plan (as long as a
# resource found without room is skipped: limits.resources.Resources.take).
HELD_BACK_FOR = 0.25
# Resource names a worker remembers as checked (`_checked`), before it starts over.
GOOD_NAMES_KEPT = 100_000
# Seconds after a claim that found a limit's lock row held by another transaction (and so
# started nothing it governs) before the worker claims again, for the jobs it held back.
HELD_RETRY = 0.05


class Admission:
    """The limits and pauses of a claim: what they let this worker start, checked inside the
    claim transaction after the rows of the limits involved are locked.

    The base of `fair_selection.FairShare`, which provides the view of the groups with ready
    work (`_current_demand`) and the read of each group's best ready jobs (`_read_groups`).
    """

    # Provided by fair_selection.FairShare.
    _current_demand: Callable[[JobQuerySet], Demand]
    _read_groups: Callable[..., dict[str, list[tuple[int, str, str, Any]]]]

    def __init__(self, settings: JobQueueSettings) -> None:
        self.group_limits = dict(settings.group_limits)
        self.queue_limits = dict(settings.queue_limits)
        dynamic = settings.dynamic_limit
        self.dynamic: Callable[[str], int | None] | None = (
            import_string(dynamic) if isinstance(dynamic, str) else dynamic
        )
        self.rate_limits = dict(settings.rate_limits)
        self.resources = Resources(settings)
        self.refresh = settings.fair_share_refresh
        self._overfetch = 1  # see OVERFETCH
        # Groups whose planned slots found no job that could start (all held back by their
        # resources), left out of the plan until then (monotonic): see _take_with_resources.
        self._held_back: dict[str, float] = {}
        self._paused: tuple[str, ...] = ()
        self._paused_until = 0.0
        self._held = pausing.Held()
        # When (monotonic) to claim again for the jobs the last select() held back because
        # another transaction held a lock row of their limits; None: none was held.
        self._held_retry: float | None = None
        # Candidates whose `uses` no claim can start ({id: why}), for leases.claim to set
        # aside; the names of resources found good already (a candidate's check is a lookup).
        self.bad_rows: dict[int, str] = {}
        self._good_names: set[str] = set()
        # How many jobs counted against a rate (RATE_LIMITS, or a LIMITS rate) a claim may
        # take: the worker's free slots, so that they start at once, never prefetched. None:
        # no bound. Set by the worker's dispatcher before each claim.
        self.rated_room: int | None = None
        # The last claim's jobs counted against a rate, and the time (monotonic) before the
        # statement whose clock recorded their starts: see Dispatcher.step.
        self.rated_ids: set[int] = set()
        self.counted_at = 0.0
        # Each of those jobs' rated units ({resource: units}), and the database's time at
        # which the claim counted them: a job handed back gives them back.
        self.rated_units: dict[int, dict[str, int]] = {}
        self.counted_db_at: dt.datetime | None = None

    def ensure_limit_rows(self, using: str) -> None:
        """Create the lock rows of the limits derived from the settings (idempotent; a claim
        makes a row it finds missing, this spares the first claims the round trip)."""
        names = sorted(name for name in self.resources.settings if not name.endswith("*"))
        # Only those missing: on MySQL an INSERT IGNORE of a row another transaction holds
        # waits for it.
        rows = Limit.objects.using(using)
        missing = set(names) - set(rows.filter(name__in=names).values_list("name", flat=True))
        if missing:
            rows.bulk_create([Limit(name=name) for name in sorted(missing)], ignore_conflicts=True)

    @property
    def has_limits(self) -> bool:
        """Whether any limit applies (LIMITS, GROUP_LIMITS, QUEUE_LIMITS, RATE_LIMITS,
        DYNAMIC_LIMIT)."""
        return bool(
            self.resources
            or self.group_limits
            or self.queue_limits
            or self.rate_limits
            or self.dynamic
        )

    def jobs_ended(self) -> bool:
        """This worker recorded outcomes: whether a claim should look again at once, because
        its last claims left jobs behind for want of a resource's concurrency room."""
        return bool(self.resources) and self.resources.jobs_ended()

    def retry_at(self) -> float | None:
        """When (time.monotonic()) a rate that held work back has room again, or None."""
        times = [t for t in (self.resources.retry_at, self._held_retry) if t is not None]
        return min(times) if times else None

    def paused_queues(self, using: str) -> tuple[str, ...]:
        """The paused queues, read at most every FAIR_SHARE_REFRESH seconds (the claim's
        only cost of queue pause: one small read per refresh, none per claim)."""
        now = time.monotonic()
        if now >= self._paused_until:
            self._paused = pausing.paused_queues(using)
            self._held = pausing.held(using)
            self._paused_until = now + self.refresh
        return self._paused

    def held(self, using: str) -> pausing.Held:
        """What the paused resources and workflows hold back, read with the paused queues."""
        self.paused_queues(using)
        return self._held

    def ask_dynamic(self, ready: JobQuerySet) -> dict[str, int | None]:
        """Ask the DYNAMIC_LIMIT hook for each group with ready work.

        Called before the claim transaction begins: a slow hook holds no lock and no open
        transaction (a transaction left idle would be ended by the server).
        """
        if self.dynamic is None:
            return {}
        return {d.group: self._dynamic(d.group) for d in self._current_demand(ready)}

    def has_starts_to_record(self) -> bool:
        """Whether `record_starts()` has anything to write for the last `select()`."""
        return self.resources.started()

    def record_starts(self, dialect: Dialect, claimed: Iterable[ClaimedJob] = ()) -> None:
        """Count the rate-limited starts of the last `select()`, once its jobs are marked.

        Called in the claim transaction after the jobs' rows were stamped `started_at`: the
        starts are counted at a clock read after that stamp, so two batches that the limiter
        held a window apart are at least that far apart in the jobs' own `started_at` too,
        however long this thread was held up between the two statements.
        """
        if self.resources.started():
            # The clock read below is the database's count of these starts: after this.
            self.counted_at = time.monotonic()
        spent: dict[tuple[str, str], int] = {}  # by handler, for the admin's Limits page
        for job in claimed:
            for name, units in self.rated_units.get(job.id, {}).items():
                spent[(name, job.type)] = spent.get((name, job.type), 0) + units
        self.counted_db_at = self.resources.record_starts(dialect, spent)

    def _take_with_resources(
        self,
        dialect: Dialect,
        ordered: JobQuerySet,
        shape: Any,
        limit: int,
        demand: Demand,
        in_flight: Mapping[str, int],
        room: Mapping[str, int | None],
        skip: tuple[str, ...],
        rated: Collection[str],
    ) -> list[tuple[int, str, str]]:
        """`_take_planned` under LIMITS: each planned group's best jobs are locked, more than
        its slots, then taken in turn while the resources they use have room (`limits.resources`).

        The resources are locked once, in name order, for all the candidates: a claim never
        waits for a resource row while holding another out of order. Slots a group's
        candidates could not fill go to the other groups' candidates that can start, and a
        group none of whose candidates could start is left out of the plans of the next
        HELD_BACK_FOR seconds. `shape` tells `ordered` from the other querysets a claim may
        build.
        """
        now = time.monotonic()
        self._held_back = {g: until for g, until in self._held_back.items() if until > now}
        # Every group held back (as a lone group would be): all are planned, as before.
        held_back: Collection[str] = self._held_back.keys()
        if all(d.group in held_back for d in demand):
            held_back = ()
        slots = plan(limit, demand, in_flight, room, skip=held_back)
        counts = {group: (n + 1) * self._overfetch for group, n in slots.items()}
        fetched = {
            group: self._checked(rows)
            for group, rows in self._read_groups(dialect, ordered, skip, shape, counts).items()
        }
        self.resources.open(dialect, (r[3] for rows in fetched.values() for r in rows))
        rows: list[tuple[int, str, str]] = []
        taken: dict[str, int] = {}
        refused = 0
        waiting: dict[str, list[Any]] = {}  # counted against a rate, with no free slot to start
        for wanted in (slots, None):  # the planned slots, then what is left, to any group
            for group, candidates in fetched.items():
                cap = room.get(group)
                while candidates and len(rows) < limit:
                    if wanted is not None and taken.get(group, 0) >= wanted[group]:
                        break
                    if cap is not None and taken.get(group, 0) >= cap:
                        break
                    pk, queue, group_key, uses = candidate = candidates.pop(0)
                    counted = group_key in rated or self.resources.rated(uses)
                    budget = self.rated_room
                    if counted and budget is not None and len(self.rated_ids) >= budget:
                        waiting.setdefault(group, []).append(candidate)  # stays ready
                        continue
                    if self.resources.take(uses, group_key, queue):
                        rows.append((pk, queue, group_key))
                        taken[group] = taken.get(group, 0) + 1
                        if counted:
                            self.rated_ids.add(pk)
                            self.rated_units[pk] = self.resources.rated_units(uses, group_key)
                    else:
                        refused += 1
        for group, kept in waiting.items():  # not refused: the group is not held back
            fetched[group] += kept
        # A group given slots whose candidates all stayed behind (none, or all refused) is
        # left out of the plan for a moment: its share goes to the groups whose jobs can
        # start. Planned again, it would take the slots of every claim and start nothing.
        for group, n in slots.items():
            if n and not taken.get(group) and not fetched[group]:
                self._held_back[group] = now + HELD_BACK_FOR
        left = sum(len(candidates) for candidates in fetched.values())
        if refused and len(rows) < sum(slots.values()):
            self._overfetch = min(OVERFETCH, self._overfetch * 2)
        elif not refused or left >= len(rows):  # none refused, or half the candidates unused
            self._overfetch = max(1, self._overfetch - 1)
        return rows

    def _checked(
        self, rows: list[tuple[int, str, str, Any]]
    ) -> list[tuple[int, str, str, dict[str, int] | None]]:
        """The candidates `rows` with their `uses` read, less those whose `uses` no claim can
        start (noted in `bad_rows`): their names would reach the database otherwise."""
        kept = []
        good = self._good_names
        for pk, queue, group_key, raw in rows:
            try:
                uses = read_json(raw)
            except ValueError:
                uses = raw  # not JSON: looked at below
            if not (
                uses is None
                or (
                    isinstance(uses, dict)
                    and all(
                        name in good and type(units) is int and units >= 1
                        for name, units in uses.items()
                    )
                )
            ):
                uses, problem = quarantine.bad_uses(raw)
                if problem:
                    self.bad_rows[pk] = problem
                    continue
                if len(good) > GOOD_NAMES_KEPT:
                    good.clear()
                good.update(uses or ())
            kept.append((pk, queue, group_key, uses))
        return kept

    def take_bad_rows(self) -> dict[int, str]:
        """The candidates found with `uses` no claim can start since the last call."""
        bad, self.bad_rows = self.bad_rows, {}
        return bad

    def _dynamic(self, group: str) -> int | None:
        if self.dynamic is None:
            return None
        try:
            value = self.dynamic(group)
            return None if value is None else max(0, int(value))
        except Exception:  # a broken hook must not stop the worker: start nothing it governs
            logger.exception("DYNAMIC_LIMIT raised for group %r; no job of it starts now", group)
            return 0


def trim_to_queue_room(
    rows: list[tuple[int, str, str]], queue_room: dict[str, int]
) -> list[tuple[int, str, str]]:
    if not queue_room:
        return rows
    left = dict(queue_room)
    kept = []
    for row in rows:
        queue = row[1]
        if queue in left:
            if left[queue] <= 0:
                continue
            left[queue] -= 1
        kept.append(row)
    return kept
