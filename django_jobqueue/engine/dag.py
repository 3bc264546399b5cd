"""The checks of a job's edges before they are written: that what it depends on (or belongs
to) exists and can take it, and that no child waits for its own container (no cycle).

Edges only ever point at jobs that exist, so a new job cannot close a cycle through its
upstreams; the one cycle possible is a child that waits, however indirectly, for its container.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from django.db.models import Model

from .. import validation
from ..dialects import get_dialect
from ..exceptions import InvalidDependencyError
from ..models import Job, JobDependency

JobRef = Job | int


def check_refs(
    using: str,
    upstream_ids: list[int],
    parent_id: int | None,
    *,
    lock: bool,
    spawning: bool = False,
) -> dict[int, str]:
    """Return {id: state} of the upstream jobs, raising if a reference is missing or unusable.

    With `lock`, the referenced rows stay locked until the transaction ends, so an upstream
    that finishes concurrently sees this job's edge when it promotes its downstream jobs, and
    a container cannot roll up while a child is being added. `spawning`: the parent is the
    running job that spawns this one (its lease is the caller's), not a container.
    """
    wanted = set(upstream_ids) | ({parent_id} if parent_id is not None else set())
    if not wanted:
        return {}
    qs: Any = Job.objects.using(using).filter(pk__in=wanted).order_by("pk")
    if lock:
        qs = get_dialect(using).lock_blocking(qs)
    found = {pk: (state, box, sealed) for pk, state, box, sealed in
             qs.values_list("pk", "state", "is_container", "sealed")}  # fmt: skip
    missing = sorted(wanted - found.keys())
    if missing:
        raise InvalidDependencyError(
            f"Job(s) {missing} do not exist on database {using!r}; a job can only depend on "
            "(or belong to) jobs that already exist."
        )
    if parent_id is not None:
        state, box, sealed = found[parent_id]
        if spawning and state in Job.LEASED_STATES:
            box = True
        if not box:
            raise InvalidDependencyError(f"parent: job {parent_id} is not a container.")
        if sealed or state in Job.TERMINAL_STATES:
            raise InvalidDependencyError(
                f"parent: container {parent_id} is sealed; it takes no more children."
            )
        if upstream_ids:
            check_no_cycle(using, upstream_ids, parent_id)
    return {pk: found[pk][0] for pk in upstream_ids}


def waits_for(using: str, start: Iterable[int]) -> Iterator[set[int]]:
    """Yield, level by level, the unfinished jobs that cannot finish before the jobs `start`.

    Those are the jobs downstream of them and the containers they belong to, transitively.
    """
    jobs = Job.objects.using(using)
    seen = set(start)
    frontier = set(seen)
    while frontier:
        yield frontier
        ordered = sorted(frontier)
        after = set(
            jobs.filter(pk__in=ordered, parent_id__isnull=False)
            .filter(parent__state__in=Job.UNFINISHED_STATES)  # a join, not NOT IN over the table
            .values_list("parent_id", flat=True)
        ) | set(
            JobDependency.objects.using(using)
            .filter(depends_on_id__in=ordered)
            .filter(job__state__in=Job.UNFINISHED_STATES)
            .values_list("job_id", flat=True)
        )
        frontier = after - seen
        seen |= frontier


def check_no_cycle(using: str, upstream_ids: list[int], parent_id: int) -> None:
    """Reject a child of `parent_id` that would wait for its own container to finish.

    Edges only point at existing jobs, but a container finishes after its children, so a
    child depending on its container (or on anything that waits for the container, or for
    one of its ancestors) could never finish, nor could the container.
    """
    wanted = set(upstream_ids)
    for level in waits_for(using, [parent_id]):
        hit = sorted(level & wanted)
        if hit:
            raise InvalidDependencyError(
                f"depends_on: job {hit[0]} cannot finish before container {parent_id} does, "
                "so a child of that container cannot wait for it (a cycle)."
            )


def job_ids(refs: Iterable[JobRef | None], using: str, what: str) -> list[int]:
    """The ids of `refs` (jobs or job ids) on database `using`, each once, in order; raise
    InvalidDependencyError naming `what` for a ref that is not a saved job of that database."""
    if isinstance(refs, Model | str | bytes | int) or not isinstance(refs, Iterable):
        raise InvalidDependencyError(f"{what} must be a list of jobs or job ids, not {refs!r}.")
    ids: list[int] = []
    for ref in refs:
        if isinstance(ref, Job):
            if ref.pk is None:
                raise InvalidDependencyError(f"{what}: job {ref!r} is not saved yet.")
            if ref._state.db not in (None, using):
                raise InvalidDependencyError(
                    f"{what}: job {ref.pk} lives on database {ref._state.db!r}, but the queue "
                    f"is on {using!r}."
                )
            ids.append(ref.pk)
        elif isinstance(ref, int) and not isinstance(ref, bool):
            if not 1 <= ref <= validation.ID_MAX:
                raise InvalidDependencyError(
                    f"{what}: job {ref} does not exist (job ids are from 1 to {validation.ID_MAX})."
                )
            ids.append(ref)
        elif isinstance(ref, Model):
            raise InvalidDependencyError(f"{what} must be jobs, not {type(ref).__name__}.")
        else:
            raise InvalidDependencyError(f"{what} must be jobs or job ids, not {ref!r}.")
    return list(dict.fromkeys(ids))
