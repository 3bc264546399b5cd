"""Staging: a `scheduled` job whose time has come becomes `ready` (`promote_due`: the
promoter duty, burst workers and `testing.run_jobs()` call it), and the workers of its queue
are woken once that commits."""

from __future__ import annotations

from ..dialects import Dialect
from ..models import Job
from ..models.functions import DbNow
from . import wake
from .wake import notify_on_commit


def promote_due(dialect: Dialect, *, batch: int) -> int:
    """Make up to `batch` due scheduled jobs `ready`, earliest first; return how many."""
    if dialect.autocommit_statements and not dialect.connection.in_atomic_block:
        queues = dialect.run_statement(lambda: dialect.promote_due(batch))
        for queue in sorted(queues):
            wake.notify(dialect.using, queue)
        return sum(queues.values())

    def txn() -> int:
        jobs = Job.objects.using(dialect.using)
        due = list(
            dialect.lock(jobs.due().order_by("run_after", "pk")).values_list("pk", "queue")[:batch]
        )
        if not due:
            return 0
        promoted = jobs.filter(pk__in=[pk for pk, _ in due], state=Job.State.SCHEDULED).update(
            state=Job.State.READY, updated_at=DbNow()
        )
        notify_on_commit(dialect, {queue for _, queue in due})
        return promoted

    return dialect.run_in_transaction(txn)
