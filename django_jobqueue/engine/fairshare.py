"""Fair share and limits: which groups win this worker's free slots.

The rule, applied slot by slot: among the groups that have ready work and are under their
limits, give the next slot to the group with the smallest load, where a group's load is
(jobs in flight in the whole database + slots given in this round) / weight. Ties go to a
weighted random draw, so even a worker that takes one job at a time serves groups in
proportion to their weights over many claims. A group that has nothing in flight has load 0
and so wins a slot before any busy group gets a second one: with at least as many free slots
as groups, every group with ready work gets at least one.

A group's weight is the largest `weight` among its ready jobs. The split itself is
`fairplan.plan()`; a claim's cost does not grow with the groups that have nothing in flight and
no cap of their own (with a group per tenant, thousands).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.models import Count, Max
from django.utils.module_loading import import_string

from .. import pausing
from ..dialects.base import read_json
from ..limits import group_resource
from ..limits.resources import Resources
from ..models import READY_GROUP_INDEX, READY_QUEUE_INDEX, JobQuerySet, Limit
from . import quarantine
from .fairplan import Demand, GroupDemand, plan

if TYPE_CHECKING:
    from ..conf import JobQueueSettings
    from ..dialects import Dialect
    from ..lease_results import ClaimedJob

# The module's name before it was renamed: users configure their logging by logger name.
logger = logging.getLogger("django_jobqueue.scheduling")
# The view of the ready groups is refreshed after at least this many times the time its read
# took (and at least FAIR_SHARE_REFRESH): at most a twentieth of a worker's time goes to it.
DEMAND_SHARE = 20
# Under LIMITS, a group's candidates are its best ready jobs, `f` times its slots and `f` more:
# some may use a resource that has no room. `f` adapts between 1 and OVERFETCH: it doubles
# after a claim that refusals left short of its slots, and comes down by one after a claim
# that refused none, or left half its candidates unused. Each candidate costs its row's
# lock, the lock of its resources' rows and their count: with every resource free, a claim
# of 10 locking 44 rows cost PostgreSQL about a third more than one locking 11.
OVERFETCH = 4
# The candidates' statements kept compiled (one set per ready shape and skipped resources).
CANDIDATE_SQL_KEPT = 64
# Seconds a group none of whose candidates could start stays out of the plan (as long as a
# resource found without room is skipped: limits.resources.Resources.take).
HELD_BACK_FOR = 0.25
# The indexes a read of one group's ready jobs goes through: the group's, or (for a worker
# that serves one queue) the queue's; never the ready index, which holds every group's.
ONE_GROUP = (READY_GROUP_INDEX, READY_QUEUE_INDEX)
# Resource names a worker remembers as checked (`_checked`), before it starts over.
GOOD_NAMES_KEPT = 100_000
# Seconds after a claim that found a limit's lock row held by another transaction (and so
# started nothing it governs) before the worker claims again, for the jobs it held back.
HELD_RETRY = 0.05


class FairShare:
    """Chooses, inside a claim transaction, which ready jobs this worker takes.

    It keeps a view of the groups with ready work, refreshed at most every
    FAIR_SHARE_REFRESH seconds (a new group waits at most that long for its first slot). With
    one group and no limits it takes the best ready jobs in one query; otherwise it plans the
    slots per group with `plan()`, within the room the limits engine (`limits.resources`)
    finds for each group after locking the rows of the limits involved, so that no two
    workers can both see room for the same last slot.
    """

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
        self._demand = Demand(())
        self._demand_until = 0.0
        self._candidate_sql: dict[Any, dict[Any, Any]] = {}  # see _read_groups()
        self._orderings: dict[int, tuple[JobQuerySet, JobQuerySet]] = {}  # see _ordered()
        self._overfetch = 1  # see OVERFETCH
        # Groups whose planned slots found no job that could start (all held back by their
        # resources), left out of the plan until then (monotonic): see _take_with_resources.
        self._held_back: dict[str, float] = {}
        self._several = False  # whether several groups had ready work, at the last look
        self._groups_until = 0.0
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
        # The groups the last claim read and how many jobs of each (quarantine.probe).
        self.last_reads: dict[str, int] = {}
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
        self.idle = False

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

    def needs_planning(self, ready: JobQuerySet) -> bool:
        """Whether this claim must go through `select()` rather than take the best jobs.

        Without limits, only several groups with ready work need planning. The view of the
        groups is cached, so this costs a query at most once per FAIR_SHARE_REFRESH, and
        none while the worker is idle (its last claim found nothing): the first claim after
        an idle spell takes the best jobs, and the view is refreshed after it.
        """
        if self.has_limits:
            return True
        if self.idle and time.monotonic() >= self._groups_until:
            return False
        return self._several_groups(ready)

    def _several_groups(self, ready: JobQuerySet) -> bool:
        """Whether more than one group has ready work, read at most every FAIR_SHARE_REFRESH.

        Two seeks in the ready-group index (the first group, then the next one after it), not
        the GROUP BY of `_current_demand()`, which reads every ready row: with hundreds of
        thousands of ready jobs of one group, that read took most of a worker's time.
        """
        now = time.monotonic()
        if now >= self._groups_until:
            keys = ready.order_by("group_key").values_list("group_key", flat=True)
            first = list(keys[:1])
            self._several = bool(first) and keys.filter(group_key__gt=first[0]).exists()
            self._groups_until = now + self.refresh
        return self._several

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

    def note_claimed(self, count: int) -> None:
        """Record how many jobs the last claim took (none: the worker is idle).

        The first claim that finds work after an idle spell forgets the views read while idle
        (no group, or the groups of before the spell): the next claim reads them anew, and
        plans the slots if several groups now have work. Kept, they would let the worker take
        the best jobs of any group for up to FAIR_SHARE_REFRESH, weights unheeded.
        """
        if self.idle and count:
            self._groups_until = self._demand_until = 0.0
        self.idle = count == 0

    def ask_dynamic(self, ready: JobQuerySet) -> dict[str, int | None]:
        """Ask the DYNAMIC_LIMIT hook for each group with ready work.

        Called before the claim transaction begins: a slow hook holds no lock and no open
        transaction (a transaction left idle would be ended by the server).
        """
        if self.dynamic is None:
            return {}
        return {d.group: self._dynamic(d.group) for d in self._current_demand(ready)}

    def select(
        self,
        dialect: Dialect,
        ready: JobQuerySet,
        limit: int,
        dynamic: dict[str, int | None] | None = None,
    ) -> list[int]:
        """Lock up to `limit` jobs from `ready`, fairly and within the limits; return their ids.

        The view of which groups have ready work is at most FAIR_SHARE_REFRESH old: a group
        new since then gets its first slot at the next refresh. The view is not refreshed
        because a limit binds (that would be a GROUP BY over the ready set per claim).
        """
        ordered = self._ordered(ready)
        demand = self._current_demand(ready)
        self._held_retry = None
        self.rated_ids, self.rated_units = set(), {}
        skip = tuple(self.resources.begin())  # resources found without room a moment ago
        if not self.has_limits and len(demand) <= 1:
            return list(dialect.lock(ordered).values_list("pk", flat=True)[:limit])
        # Ask the hook before taking the lock rows: a slow hook must not hold every worker.
        if dynamic is None:
            dynamic = self.ask_dynamic(ready)
        # A group the hook was not asked about (the view changed meanwhile) starts nothing.
        dynamic = {d.group: dynamic.get(d.group, 0) for d in demand} if self.dynamic else {}
        # The groups' and queues' limits (their rows locked, the jobs in flight counted after
        # the lock). The jobs in flight weigh the split: moot for a lone group (LIMITS alone,
        # one group: a claim spares the count). Every group's, not only the ready ones': the
        # jobs in flight are few, where a filter naming thousands of groups cost more.
        in_flight = self.resources.open_groups(
            dialect, demand.by_name, dynamic, count=len(demand) > 1
        )
        # The room of the groups under a limit (absent: no limit); not a pass over every group.
        room = self.resources.group_rooms()
        # A rated group's jobs start at once or not at all: at most the free slots.
        rated = self.resources.rated_groups()
        if self.rated_room is not None:
            for group in rated:
                left = room.get(group)
                room[group] = self.rated_room if left is None else min(left, self.rated_room)
        if self.resources.held_groups:  # a limit's row held elsewhere: look again soon
            self._held_retry = time.monotonic() + HELD_RETRY
        queue_room = self.resources.queue_room()
        if queue_room:
            full = [q for q, n in queue_room.items() if n <= 0]
            ordered = ordered.exclude(queue__in=full)
        shape = (ready, tuple(sorted(full)) if queue_room else ())
        if self.resources:
            picked = self._take_with_resources(
                dialect, ordered, shape, limit, demand, in_flight, room, skip, rated
            )
            rows = _trim_to_queue_room(picked, queue_room)
        else:
            picked = self._take_planned(dialect, ordered, shape, limit, demand, in_flight, room)
            rows = _trim_to_queue_room(picked, queue_room)
            if self.rated_room is not None:
                # Several rated groups, each within the room: the first ones in the claim take it.
                counted = [pk for pk, _, group in rows if group in rated][: self.rated_room]
                rows = [row for row in rows if row[2] not in rated or row[0] in counted]
            self.rated_ids = {pk for pk, _, group in rows if group in rated}
            self.rated_units = {
                pk: {group_resource(group): 1} for pk, _, group in rows if group in rated
            }
            self.resources.took(rows)
        taken: dict[str, int] = {}
        for _, _, group in rows:
            taken[group] = taken.get(group, 0) + 1
        wanting = {g: demand.by_name[g].ready for g in room}
        self.resources.settle_claim(wanting, taken)
        return [pk for pk, _, _ in rows]

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

    def _take_planned(
        self,
        dialect: Dialect,
        ordered: JobQuerySet,
        shape: Any,
        limit: int,
        demand: Demand,
        in_flight: Mapping[str, int],
        room: Mapping[str, int | None],
    ) -> list[tuple[int, str, str]]:
        """Lock the jobs `plan()` gives each group; return their (id, queue, group) rows.

        The slots a group left unused are planned again.

        A group whose ready rows were all locked by concurrent claims (SKIP LOCKED), or were
        fewer than the cached view said, gives its slots back to the others: otherwise a claim
        could come back empty while other groups had claimable jobs.
        """
        rows: list[tuple[int, str, str]] = []
        taken: dict[str, int] = {}
        short: set[str] = set()  # groups that yielded fewer rows than planned
        while len(rows) < limit:
            slots = plan(
                limit - len(rows),
                demand,
                {g: in_flight.get(g, 0) + taken.get(g, 0) for g in {*in_flight, *taken}},
                {g: None if r is None else r - taken.get(g, 0) for g, r in room.items()},
                skip=short,
            )
            if not slots:
                break
            # A group read again reads its rows taken already too (SKIP LOCKED skips the
            # locks of other transactions, not this one's), which are dropped.
            counts = {group: taken.get(group, 0) + n for group, n in slots.items()}
            found = self._read_groups(dialect, ordered, (), shape, counts)
            have = {row[0] for row in rows}
            for group, n in slots.items():
                got = [row[:3] for row in found[group] if row[0] not in have][:n]
                if len(got) < n:
                    short.add(group)
                taken[group] = taken.get(group, 0) + len(got)
                rows += got
        return rows

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

    def _ordered(self, ready: JobQuerySet) -> JobQuerySet:
        """`ready` in the order a claim takes its jobs, built once per ready queryset (a
        claim's `ready` is built once per shape: `leases._ready`)."""
        found = self._orderings.get(id(ready))
        if found is None or found[0] is not ready:
            if len(self._orderings) >= CANDIDATE_SQL_KEPT:
                self._orderings.clear()
            found = self._orderings[id(ready)] = (ready, ready.order_by("-priority", "pk"))
        return found[1]

    def _read_groups(
        self,
        dialect: Dialect,
        ordered: JobQuerySet,
        skip: tuple[str, ...],
        shape: Any,
        counts: Mapping[str, int],
    ) -> dict[str, list[tuple[int, str, str, Any]]]:
        """Lock the best ready jobs in `ordered` of each group of `counts`, up to its count,
        that use no resource of `skip`; return {group: its (id, queue, group, uses) rows, in
        claim order}, `uses` as the cursor gave it.

        One statement for all the groups (`Dialect.group_reads_sql`; more where a database
        needs them split), each group's read through its own index: a claim that plans ten
        groups makes one round trip, not ten. `shape` tells `ordered` from the other
        querysets a claim may use: the SQL is compiled by the ORM once per shape and skipped
        resources.
        """
        cache_key = (dialect.using, shape, skip)
        compiled = self._candidate_sql.get(cache_key)
        if compiled is None:
            if len(self._candidate_sql) >= CANDIDATE_SQL_KEPT:
                self._candidate_sql.clear()
            compiled = self._candidate_sql[cache_key] = {}
            base = ordered.exclude(uses__has_any_keys=list(skip)) if skip else ordered
            compiled["query"] = base.values_list("pk", "queue", "group_key", "uses", "priority")
        found: dict[str, list[tuple[int, str, str, Any]]] = {group: [] for group in counts}
        reads = list(counts.items())
        self.last_reads = dict(counts)
        if not reads:  # nothing planned: no statement
            return found
        rows: list[Any] = []
        for sql, params in dialect.group_reads_sql(compiled["query"], reads, ONE_GROUP, compiled):
            with dialect.cursor() as cursor:
                cursor.execute(sql, params)
                rows += cursor.fetchall()
        if len(reads) == 1:  # one read: its rows in claim order, without its number
            found[reads[0][0]] = [row[:4] for row in rows]
            return found
        # In claim order within each read (a UNION's order is not its branches'), up to its
        # count (a dialect may return more: SQLite's reads all take the largest).
        for n, pk, queue, group_key, uses, _ in sorted(
            rows, key=lambda row: (row[0], -row[5], row[1])
        ):
            group, count = reads[n]
            if len(found[group]) < count:
                found[group].append((pk, queue, group_key, uses))
        return found

    def _current_demand(self, ready: JobQuerySet) -> Demand:
        now = time.monotonic()
        # An empty view is refreshed at every claim under limits: the first jobs after an
        # idle spell must not wait for the refresh (the GROUP BY is cheap on an empty set).
        if now >= self._demand_until or (not self._demand and self.has_limits):
            query = (
                ready.order_by()
                .values_list("group_key")
                .annotate(w=Max("weight"), n=Count("pk"))
                .values_list("group_key", "w", "n")
            )
            # Read by a raw cursor: the ORM's conversion of each row cost more than the read
            # with thousands of groups (a group per tenant).
            sql, params = query.query.get_compiler(using=query.db).as_sql()
            with connections[query.db].cursor() as cursor:
                cursor.execute(sql, params)
                self._demand = Demand(GroupDemand._make(row) for row in cursor.fetchall())
            # The GROUP BY reads every ready row: with a large backlog it is refreshed less
            # often, so that it takes at most a twentieth of the worker's time.
            took = time.monotonic() - now
            self._demand_until = now + max(self.refresh, DEMAND_SHARE * took)
        return self._demand

    def _dynamic(self, group: str) -> int | None:
        if self.dynamic is None:
            return None
        try:
            value = self.dynamic(group)
            return None if value is None else max(0, int(value))
        except Exception:  # a broken hook must not stop the worker: start nothing it governs
            logger.exception("DYNAMIC_LIMIT raised for group %r; no job of it starts now", group)
            return 0


def _trim_to_queue_room(
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
