"""Fair share: which ready jobs a claim takes, group by group (`FairShare.select`).

The rule, applied slot by slot: among the groups that have ready work and are under their
limits, give the next slot to the group with the smallest load, where a group's load is
(jobs in flight in the whole database + slots given in this round) / weight. Ties go to a
weighted random draw, so even a worker that takes one job at a time serves groups in
proportion to their weights over many claims. A group that has nothing in flight has load 0
and so wins a slot before any busy group gets a second one: with at least as many free slots
as groups, every group with ready work gets at least one.

A group's weight is the largest `weight` among its ready jobs. The split of the slots itself
is `slot_split.plan()` (arithmetic only); a claim's cost does not grow with the groups that
have nothing in flight and no cap of their own (with a group per tenant, thousands). What the
limits and pauses let a claim start is `admission.Admission`, the base of `FairShare`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.models import Count, Max

from ..limits import group_resource
from ..models import READY_GROUP_INDEX, READY_QUEUE_INDEX, JobQuerySet
from .admission import HELD_RETRY, Admission, trim_to_queue_room
from .slot_split import Demand, GroupDemand, plan

if TYPE_CHECKING:
    from ..conf import JobQueueSettings
    from ..dialects import Dialect

# The view of the ready groups is refreshed after at least this many times the time its read
# took (and at least FAIR_SHARE_REFRESH): at most a twentieth of a worker's time goes to it.
DEMAND_SHARE = 20
# The candidates' statements kept compiled (one set per ready shape and skipped resources).
CANDIDATE_SQL_KEPT = 64
# The indexes a read of one group's ready jobs goes through: the group's, or (for a worker
# that serves one queue) the queue's; never the ready index, which holds every group's.
ONE_GROUP = (READY_GROUP_INDEX, READY_QUEUE_INDEX)


class FairShare(Admission):
    """Chooses, inside a claim transaction, which ready jobs this worker takes.

    It keeps a view of the groups with ready work, refreshed at most every
    FAIR_SHARE_REFRESH seconds (a new group waits at most that long for its first slot). With
    one group and no limits it takes the best ready jobs in one query; otherwise it plans the
    slots per group with `plan()`, within the room the limits engine (`limits.resources`)
    finds for each group after locking the rows of the limits involved, so that no two
    workers can both see room for the same last slot.
    """

    def __init__(self, settings: JobQueueSettings) -> None:
        super().__init__(settings)
        self._demand = Demand(())
        self._demand_until = 0.0
        self._candidate_sql: dict[Any, dict[Any, Any]] = {}  # see _read_groups()
        self._orderings: dict[int, tuple[JobQuerySet, JobQuerySet]] = {}  # see _ordered()
        self._several = False  # whether several groups had ready work, at the last look
        self._groups_until = 0.0
        # The groups the last claim read and how many jobs of each (quarantine.probe).
        self.last_reads: dict[str, int] = {}
        self.idle = False

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
            rows = trim_to_queue_room(picked, queue_room)
        else:
            picked = self._take_planned(dialect, ordered, shape, limit, demand, in_flight, room)
            rows = trim_to_queue_room(picked, queue_room)
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
