"""Promotion: waiting and scheduled jobs made runnable.

Owns `promote` (waiting jobs whose upstreams are done, or enough of their awaited jobs final,
become ready, or scheduled when their `run_after` lies ahead; a sequenced job only as its
sequence's head) and `promote_due` (due scheduled jobs made ready in one autocommit statement,
where the database has one).

Invariant: only rows still `waiting` (for `promote`), locked by the caller, change state.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db.models import Case, Count, Exists, OuterRef, Q, Value, When

from ..models import Job, JobDependency, JobSequence, JobWait
from ..models.functions import DbNow
from .sql import SQL


class Promotion(SQL):
    """Waiting jobs whose upstreams allow it, and due scheduled jobs, made runnable."""

    def promote(self, ids: Sequence[int]) -> set[str]:
        """Make the locked waiting jobs `ids` whose upstreams are all done runnable.

        They become `ready`, or `scheduled` when their `run_after` lies ahead. An `awaits`
        edge (ctx.wait_for) needs its upstream final, not done; a job whose JobWait row has a
        `count` needs only that many of its awaited jobs final. Returns the queues of the jobs
        promoted. Portable version: the blocked ones, then an UPDATE.
        """
        not_done = [s for s in Job.State.values if s != Job.State.DONE]
        edges = JobDependency.objects.using(self.using)
        found = set(
            edges.filter(job_id__in=self.id_set(ids))
            .filter(
                Q(awaits=False, depends_on__state__in=not_done)
                | Q(awaits=True, depends_on__state__in=Job.UNFINISHED_STATES)
            )
            .values_list("job_id", "awaits")
        )
        blocked = {pk for pk, awaits in found if not awaits}
        awaiting = sorted({pk for pk, awaits in found if awaits} - blocked)
        if awaiting:
            need = {
                pk: count or 0
                for pk, count in JobWait.objects.using(self.using)
                .filter(job_id__in=awaiting, count__isnull=False)
                .values_list("job_id", "count")
            }
            final: dict[int, int] = dict(
                edges.filter(job_id__in=sorted(need), awaits=True)
                .filter(depends_on__state__in=Job.TERMINAL_STATES)
                .values_list("job_id")
                .annotate(n=Count("pk"))
                .values_list("job_id", "n")
            ) if need else {}  # fmt: skip
            blocked.update(pk for pk in awaiting if pk not in need or final.get(pk, 0) < need[pk])
        runnable = [pk for pk in ids if pk not in blocked]
        if not runnable:
            return set()
        jobs = Job.objects.using(self.using)
        chosen = jobs.filter(pk__in=self.id_set(runnable), state=Job.State.WAITING)
        # A sequenced job goes only as its sequence's head (sequences.py): the others wait.
        heads = JobSequence.objects.using(self.using).filter(
            key=OuterRef("sequence"), head=OuterRef("pk")
        )
        chosen = chosen.filter(Q(sequence__isnull=True) | Q(Exists(heads)))
        queues = set(chosen.order_by().values_list("queue", flat=True).distinct())
        later = Case(
            When(run_after__gt=DbNow(), then=Value(Job.State.SCHEDULED)),
            default=Value(Job.State.READY),
        )
        return queues if chosen.update(state=later, updated_at=DbNow()) else set()

    def promote_due(self, batch: int) -> dict[str, int]:
        """Make up to `batch` due scheduled jobs `ready` (earliest first), in one autocommit
        statement that also wakes the other processes' workers; return {queue: how many}.

        Only where `autocommit_statements`; see PostgreSQLDialect.
        """
        raise NotImplementedError
