"""Fan-out and fan-in: a wait for the first N of many jobs (ctx.wait_for with `count`,
ctx.wait_for_any).

A wait for `count` of its jobs suspends the job as a wait for all of them does (an `awaits`
edge to each), with a JobWait row that holds the count: a job finishing promotes the waiting
one once that many of its awaited jobs are final (`Dialect.promote`). When the wait ends, in
the transaction of its record, the job's edges to the jobs still unfinished and its JobWait
row are deleted (a later finish of one of those must not wake the job again), and with
`cancel_rest` those jobs are cancelled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..exceptions import InvalidJobError
from ..models import Job, JobDependency, JobWait
from . import control, workflows
from .replay import fence, write

if TYPE_CHECKING:
    from .context import JobContext


def check_count(count: Any, ids: list[int]) -> int | None:
    """The number of `ids` a wait needs final: None for all of them (`count` None, or as
    many as there are), else `count`; InvalidJobError for a count the jobs cannot meet."""
    if count is None:
        return None
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise InvalidJobError(f"wait_for: count must be an integer >= 1, not {count!r}")
    if count > len(ids):
        raise InvalidJobError(
            f"wait_for: count={count} but only {len(ids)} distinct job(s) to wait for"
        )
    return None if count == len(ids) else count


def end_wait(
    ctx: JobContext,
    name: str,
    seq: int,
    ids: list[int],
    count: int,
    states: dict[int, str],
    cancel_rest: bool,
) -> dict[str, Any]:
    """Record the end of a wait for `count` of `ids` (`states`: those final now, at least
    `count`) and return the record; with `cancel_rest`, cancel the others.

    One transaction, fenced by the lease: the record, the deletion of the edges to the jobs
    still unfinished and of the JobWait row, and the cancellations commit together, so that
    a replay finds the same jobs final (the cancelled ones are not among them). The rows of
    the jobs cancelled are locked before the waiting job's, the order in which a job that
    finishes locks its own row, then those of the jobs that wait for it.
    """
    dialect, lease = ctx._dialect, ctx._lease
    rest = [pk for pk in ids if pk not in states]
    found = {
        "ids": ids,
        "count": count,
        "states": {str(pk): state for pk, state in sorted(states.items())},
    }
    with dialect.step_transaction():
        if cancel_rest and rest:
            workflows.lock_jobs(dialect, rest)
        fence(dialect, lease)
        edges = JobDependency.objects.using(dialect.using)
        edges.filter(job_id=lease.job_id, awaits=True, depends_on_id__in=rest).delete()
        JobWait.objects.using(dialect.using).filter(job_id=lease.job_id).delete()
        if cancel_rest:
            found["cancelled"] = [pk for pk in rest if control.cancel(pk)]
        write(ctx, name, seq, found, None)
    ctx._calls.remember(name, seq, found)
    return found


def final_states(states: dict[int, str]) -> dict[int, str]:
    """Those of `states` ({job id: state}) that are final."""
    return {pk: state for pk, state in states.items() if state in Job.TERMINAL_STATES}
