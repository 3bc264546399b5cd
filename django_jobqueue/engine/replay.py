"""The records a run of a durable job replays, the check that it replays them as it ran, and
the writing of a record, fenced by the job's lease.

Each durable call of a run takes the next place (1, 2, ...) and is known by its name and call
number (`seq`: how many times this run called that name before). Its record keeps all three.
A later run's call finds its record by name and call number, as it always has; where the
record has a place, it must also be the call at that place: a call that asks for another name
(or another kind of call: a step where a sleep was recorded) at a recorded place raises
`ReplayMismatch`, and so does a call whose record sits at another place. The first mismatch
of a run is kept: every later durable call of that run raises it again, and the attempt fails
with it whatever the handler does with it (the job ends `dead`: each retry would meet it
again). Records written before places were have none, and are matched by name and call only.

`ctx.patched(id)` (`patch`) records its answer as a record "@patch" at its place, whose call
number is its place. A replay that meets such a record where its code now makes another call
passes over it: the `patched()` call was taken out once every job had taken its new path.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, InterfaceError

from ..dialects.base import read_json
from ..exceptions import LeaseLost, ReplayMismatch
from ..models import Job, JobStep

if TYPE_CHECKING:
    from ..dialects import Dialect
    from ..lease_results import ClaimedJob
    from .context import JobContext
    from .leases import Lease

logger = logging.getLogger("django_jobqueue.replay")

SLEEP, EVENT, SPAWN, WAIT, PATCH = "@sleep", "@event", "@spawn", "@wait", "@patch"
MAP = "@map"
# How a mismatch's message names the queue's own calls.
KINDS = {
    SLEEP: "a sleep",
    EVENT: "an event wait",
    SPAWN: "a spawn",
    WAIT: "a wait for jobs",
    MAP: "a map",
    "@acquire": "an acquire",
    "@settle": "a settle",
}
# Records read with a claim, per resumed job on average (see `preload`).
PRELOAD_ROWS = 20
MISSING: Any = object()
# Off only in bench/replay_check.py's "before" drain: calls take no place (their records have
# none, and are matched by name and call number only, as records from before places are).
_CHECK_PLACES = True

type Key = tuple[str, int]


class Stored:
    """A record's result as the claim's read returned it, decoded at first use (a resumed
    sleep only asks whether its record is there)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class Calls:
    """The durable calls of one run: what earlier runs recorded (and where), the count of each
    name, and the places taken so far."""

    def __init__(
        self,
        dialect: Dialect,
        job_id: int,
        has_steps: bool = True,
        recorded: dict[Key, Any] | None = None,
        places: dict[int, Key] | None = None,
    ) -> None:
        self.dialect = dialect
        self.job_id = job_id
        self.has_steps = has_steps  # the job's row says so already (no need to mark it)
        # None: read at the run's first durable call; {} when the claim said there is none;
        # `recorded` (and `places`) when the worker read them with the claim (`preload`).
        if recorded is None and not has_steps:
            recorded = {}
        self._recorded = recorded
        self._places: dict[int, Key] = dict(places or {})  # recorded place -> its call
        self._placed = {key: place for place, key in self._places.items()}
        self._counts: Counter[str] = Counter()
        self._place = 0  # the last place this run's calls took
        self._taken: dict[Key, int] = {}  # this run's calls: their places, for their records
        self._met = 0  # the records this run's calls found, passed over or wrote
        self.patches: dict[str, bool] = {}  # patched()'s answers in this run, by id
        self.mismatch: ReplayMismatch | None = None

    @property
    def read(self) -> bool:
        """Whether the job's records are known to this run (`load` has nothing to do)."""
        return self._recorded is not None

    def load(self) -> None:
        """Read the job's records (once, at a run's first durable call)."""
        rows = JobStep.objects.using(self.dialect.using).filter(job_id=self.job_id)
        self._recorded, self._places = {}, {}
        for name, seq, result, place in rows.values_list("name", "seq", "result", "place"):
            self._recorded[(name, seq)] = result
            if place is not None:
                self._places[place] = (name, seq)
        self._placed = {key: place for place, key in self._places.items()}

    def next(self, name: str, *, decode: bool = True) -> tuple[int, Any]:
        """Number this run's next call of `name` and give it the next place; return (seq, its
        record or MISSING); ReplayMismatch if another call was recorded at its place.

        With `decode=False` a record read with the claim may come back as `Stored` (the
        caller only asks whether there is one).
        """
        recorded = self._loaded()
        self._counts[name] += 1
        key = (name, self._counts[name])
        self._take(key)
        found = recorded.get(key, MISSING)
        if found is not MISSING:
            self._met += 1
            if decode and type(found) is Stored:
                found = recorded[key] = read_json(found.value)
        return key[1], found

    def _loaded(self) -> dict[Key, Any]:
        if self.mismatch is not None:  # the run goes no further
            raise self.mismatch
        if self._recorded is None:
            self.load()
        assert self._recorded is not None
        return self._recorded

    def _take(self, key: Key) -> None:
        if not _CHECK_PLACES:
            return
        place = self._place + 1
        at = self._places.get(place)
        while at is not None and at[0] == PATCH:  # a patched() call since taken out
            self._met += 1
            place += 1
            at = self._places.get(place)
        if at is not None and at != key:
            self._mismatch(place, self.describe(at), key)
        elsewhere = self._placed.get(key)
        if at is None and elsewhere is not None:
            self._mismatch(place, f"nothing (its record is at place {elsewhere})", key)
        self._place = self._taken[key] = place

    def _mismatch(self, place: int, recorded: str, asked: Key) -> None:
        self.mismatch = ReplayMismatch(self.job_id, place, recorded, self.describe(asked))
        raise self.mismatch

    def patch(self, patch_id: str) -> tuple[bool, int | None]:
        """ctx.patched(patch_id): True if this job had not yet passed this call when it was
        deployed, else False; and the place of the record to write (None: nothing to write).

        The first call of an id in a run decides, the later ones get the same answer. True
        takes a place: the job's record there says so on every later run. False takes none,
        as the code before the patch made no call there: whenever this run has records left
        that it has not met (the job had gone further under the old code).
        """
        if patch_id in self.patches:
            return self.patches[patch_id], None
        recorded = self._loaded()
        place = self._place + 1
        at = self._places.get(place)
        write = None
        if at is not None and at[0] == PATCH and self._value(at).get("patch") == patch_id:
            self._met += 1
            self._place = place
            answer = True
        elif self._met < len(recorded):
            answer = False
        else:
            self._place = self._taken[(PATCH, place)] = write = place
            answer = True
        self.patches[patch_id] = answer
        return answer, write

    def _value(self, key: Key) -> Any:
        assert self._recorded is not None
        found = self._recorded[key]
        if type(found) is Stored:
            found = self._recorded[key] = read_json(found.value)
        return found

    def place_of(self, name: str, seq: int) -> int | None:
        """The place this run's call (name, seq) took (None: it took none)."""
        return self._taken.get((name, seq))

    def describe(self, key: Key) -> str:
        """A call as a mismatch's message names it: "step 'a'", "a sleep (call 2)", ..."""
        name, seq = key
        if name == PATCH:
            value = self._value(key) if self._recorded and key in self._recorded else {}
            return f"patched({value.get('patch', '?')!r})"
        what = KINDS.get(name, f"step {name!r}")
        return what if seq == 1 else f"{what} (call {seq})"

    def recorded(self) -> dict[Key, Any]:
        """Every record of the job, decoded (read at the first call that needs them)."""
        if self._recorded is None:
            self.load()
        assert self._recorded is not None
        for key, value in self._recorded.items():
            if type(value) is Stored:
                self._recorded[key] = read_json(value.value)
        return self._recorded

    def remember(self, name: str, seq: int, result: Any) -> None:
        """Keep the result just recorded (its transaction committed)."""
        assert self._recorded is not None
        key = (name, seq)
        if key not in self._recorded:
            self._met += 1
        self._recorded[key] = result
        place = self._taken.get(key)
        if place is not None:
            self._places[place], self._placed[key] = key, place
        self.has_steps = True


def preload(dialect: Dialect, jobs: Sequence[ClaimedJob]) -> None:
    """Read the records of the claimed `jobs` that have some, in one query: set each one's
    `records` and `places`, which its run then uses instead of a read of its own.

    A resumed job's run (after a sleep, say) otherwise begins with a round trip of its own:
    with short resumes that read was most of their cost. At most PRELOAD_ROWS rows a job on
    average are read; a job whose rows may not all have come is left to read its own. A read
    that fails leaves them all to do so (their leases are held: nothing may be lost here).
    """
    ids = sorted(job.id for job in jobs if job.has_steps)
    if not ids:
        return
    cap = PRELOAD_ROWS * len(ids)
    try:
        rows = dialect.read_records(ids, cap + 1)
    except (DatabaseError, InterfaceError) as exc:
        logger.debug("Could not read the records of %s claimed job(s): %s", len(ids), exc)
        return
    # Read in job order: when the cap cut the read short, the last job's rows (and those of
    # the jobs after it) may be missing.
    complete_below = rows[-1][0] if len(rows) > cap else None
    found: dict[int, dict[Key, Any]] = {pk: {} for pk in ids}
    places: dict[int, dict[int, Key]] = {pk: {} for pk in ids}
    for job_id, name, seq, result, place in rows:
        found[job_id][(name, seq)] = Stored(result)
        if place is not None:
            places[job_id][place] = (name, seq)
    for job in jobs:
        if job.has_steps and (complete_below is None or job.id < complete_below):
            job.records, job.places = found[job.id], places[job.id]


# -- writing a record ----------------------------------------------------------------------------


def fence(dialect: Dialect, lease: Lease) -> None:
    """Lock the job's row while `lease` is current (in the caller's transaction); else LeaseLost."""
    found = dialect.lock_blocking(Job.objects.using(dialect.using).filter(lease.q()))
    if not found.values_list("pk", flat=True).first():
        raise lease_lost(lease)


def lease_lost(lease: Lease) -> LeaseLost:
    return LeaseLost(
        f"job {lease.job_id} attempt {lease.attempt} of {lease.owner} no longer holds "
        "its lease: nothing was recorded"
    )


def write(ctx: JobContext, name: str, seq: int, result: Any, duration: float | None) -> None:
    """Insert the record of a call, fenced by the lease (the job's row stays locked until the
    caller's transaction ends); else LeaseLost."""
    dialect, lease = ctx._dialect, ctx._lease
    recorded = dialect.record_call(
        job_id=lease.job_id,
        owner=lease.owner,
        attempt=lease.attempt,
        name=name,
        seq=seq,
        place=ctx._calls.place_of(name, seq),
        result=result,
        duration=duration,
        mark=not ctx._calls.has_steps,  # the job's first record: say so on its row
    )
    if not recorded:
        raise lease_lost(lease)
