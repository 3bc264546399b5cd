"""The split of a claim's free slots over the groups with ready work (`plan`): arithmetic only,
no database and no lock (`fair_selection.FairShare` reads the demand and locks the jobs).

The rule, applied slot by slot: among the groups that have ready work and are under their
limits, the next slot goes to the group of the smallest load, (jobs in flight + slots given)
/ weight. Ties go to a draw weighted by `weight`: each group in the running carries an
exponential variate of rate `weight`, drawn anew each time it goes back in, and the smallest
wins among equal loads, which it does with probability weight / (sum of the tied weights).

A claim must not cost a pass over every group: with a group per tenant there are thousands,
of which nearly all have nothing in flight and no cap of their own ("idle" groups, load 0).
Those are not put in the running one by one: `_Race` draws them in the order of their
variates, one at a time as the plan needs the next one (the exponential variates' order
statistics, drawn in turn: the next one is the last plus a variate of rate the sum of the
weights left, and it belongs to a group drawn in proportion to its weight). A claim costs
O(busy groups + slots * log), the groups sorted by weight once per view of the demand
(`Demand`).
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

_rng = random.Random()


class GroupDemand(NamedTuple):
    """One group's ready work as the claim sees it."""

    group: str
    weight: int
    ready: int  # ready jobs visible (an upper bound on what the group can take)


class Demand(Sequence[GroupDemand]):
    """A view of the groups with ready work, kept between claims: the groups by name, and
    those of a positive weight sorted by weight for `_Race`."""

    def __init__(self, groups: Iterable[GroupDemand]) -> None:
        self.groups = list(groups)
        self.by_name = {d.group: d for d in self.groups}
        if len(self.by_name) < len(self.groups):  # a GROUP BY never gives one twice
            raise ValueError("a group is named twice in the demand")
        self.by_weight: dict[int, list[GroupDemand]] = {}
        self.place: dict[str, int] = {}  # a group's index in its weight's list
        for d in self.groups:
            if d.weight > 0:
                same = self.by_weight.setdefault(d.weight, [])
                self.place[d.group] = len(same)
                same.append(d)

    def __len__(self) -> int:
        return len(self.groups)

    def __getitem__(self, index: Any) -> Any:
        return self.groups[index]

    def __iter__(self) -> Iterator[GroupDemand]:
        return iter(self.groups)


class _Race:
    """The idle groups of a `Demand` (all but `out`), drawn in the order of independent
    exponential variates of rate `weight`, without drawing one for each."""

    def __init__(self, demand: Demand, out: Collection[str], rng: random.Random) -> None:
        self.rng = rng
        self.at = 0.0  # the last variate drawn
        self.pools = demand.by_weight
        # Per weight: the indexes gone (drawn, or out of the race) while they are few (drawn
        # around), or else the indexes left (drawn from); and how many are left.
        self.taken: dict[int, set[int]] = {w: set() for w in demand.by_weight}
        self.untaken: dict[int, list[int]] = {}
        for group in out:
            d = demand.by_name.get(group)
            if d is not None and d.weight > 0:
                self.taken[d.weight].add(demand.place[group])
        self.left = {w: len(gs) - len(self.taken[w]) for w, gs in demand.by_weight.items()}
        self.total = sum(w * n for w, n in self.left.items())

    def next(self) -> tuple[float, GroupDemand] | None:
        """The next group (the smallest variate left) and its variate; None when none is left."""
        if self.total <= 0:
            return None
        self.at += self.rng.expovariate(self.total)
        pick = self.rng.random() * self.total
        weight = 0
        for weight, n in ((w, n) for w, n in self.left.items() if n > 0):
            pick -= weight * n
            if pick < 0:
                break
        pool, taken = self.pools[weight], self.taken[weight]
        if weight not in self.untaken and len(taken) * 2 <= len(pool):
            # Mostly left: draw until one comes that is.
            while (index := self.rng.randrange(len(pool))) in taken:
                pass
            taken.add(index)
        else:  # mostly gone: draw from the list of those left (made once), swap-removed
            if weight not in self.untaken:
                self.untaken[weight] = [i for i in range(len(pool)) if i not in taken]
            left = self.untaken[weight]
            at = self.rng.randrange(len(left))
            index, left[at] = left[at], left[-1]
            left.pop()
        self.left[weight] -= 1
        self.total -= weight
        return self.at, pool[index]


def plan(
    free: int,
    demand: Sequence[GroupDemand],
    in_flight: Mapping[str, int],
    room: Mapping[str, int | None],
    rng: random.Random | None = None,
    skip: Collection[str] = (),
) -> dict[str, int]:
    """Split `free` slots over the groups in `demand` but those in `skip`; return {group:
    slots}.

    `in_flight` counts running jobs per group across all workers; `room` says how many more
    jobs a group may start under its limits (absent or None: unlimited). Pass a `Demand` to
    spare its sorting at each call.
    """
    if len(demand) == 1:  # a lone group takes what its ready jobs and its room allow
        d = demand[0]
        cap = room.get(d.group)
        n = min(free, d.ready, d.ready if cap is None else cap)
        return {d.group: n} if n > 0 and d.weight > 0 and d.group not in skip else {}
    rng = rng or _rng
    view = demand if isinstance(demand, Demand) else Demand(demand)
    given: dict[str, int] = {}
    order = itertools.count()

    def fits(d: GroupDemand, n: int) -> bool:
        cap = room.get(d.group)
        return n < d.ready and (cap is None or n < cap)

    # The busy groups (something in flight, or a cap) go in the heap at once; the idle ones
    # come from the race, the next one always in the heap (its last field says so).
    busy = sorted(g for g in {*in_flight, *room} if g in view.by_name and g not in skip)
    heap = [
        (in_flight.get(d.group, 0) / d.weight, rng.expovariate(d.weight), next(order), d, False)
        for d in map(view.by_name.__getitem__, busy)
        if d.weight > 0 and fits(d, 0)
    ]
    race = _Race(view, {*busy, *skip}, rng)
    if free > 0 and (drawn := race.next()):
        heap.append((0.0, drawn[0], next(order), drawn[1], True))
    heapq.heapify(heap)
    left = max(0, free)
    while left and heap:
        _, _, _, d, idle = heapq.heappop(heap)
        if idle:
            if drawn := race.next():
                heapq.heappush(heap, (0.0, drawn[0], next(order), drawn[1], True))
            if not fits(d, 0):  # no ready job (a caller's view): not a candidate
                continue
        left -= 1
        n = given[d.group] = given.get(d.group, 0) + 1
        if fits(d, n):
            load = (in_flight.get(d.group, 0) + n) / d.weight
            heapq.heappush(heap, (load, rng.expovariate(d.weight), next(order), d, False))
    return given
