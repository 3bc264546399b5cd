"""The finish: ending leases with an outcome, fenced by the lease that claimed the job.

Owns the batched finish of successful jobs (`finish_many`: done, or cancelled when asked),
the sorting of the jobs it could not finish (busy, lost, or finished already by this lease
before a lost reply), the autocommit finishes of simple jobs and sleeps where the database
has them, and the columns of every move to a final state (`terminal_columns`).

Invariant: a job is finished only while its lease is still (owner, attempt); a row another
transaction holds is skipped, never waited for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.models import Case, TextField, Value, When

from ..lease_results import Finished, FinishReport
from ..models import Job
from ..models.functions import DbNow
from .transactions import Transactions


def terminal_columns(state: str, **extra: Any) -> dict[str, Any]:
    """Return the column values of a move to the final `state` (ends lease and unique slot)."""
    return {
        "state": state,
        "lease_owner": None,
        "lease_expires": None,
        "finished_at": DbNow(),
        "updated_at": DbNow(),
        "unique_slot": None,
        **extra,
    }


class Finishing(Transactions):
    """The fenced, batched finish of leased jobs, and the autocommit finishes."""

    # Set by Dialect (base.py) and its vendors.
    has_select_for_update_skip_locked: bool

    def finish_many(
        self, *, owner: str, items: Sequence[tuple[int, int, str | None]]
    ) -> FinishReport:
        """Store each (job id, attempt, result as JSON text) and mark the job done, fenced.

        Runs inside a transaction. A row another transaction holds locked is skipped (`busy`)
        rather than waited for; a row whose lease is no longer (owner, attempt) is `lost`. A
        job whose cancellation was requested ends `cancelled` and its result is discarded.
        Portable version: a locking read, then one UPDATE per final state.
        """
        jobs = Job.objects.using(self.using)
        wanted = {job_id: attempt for job_id, attempt, _ in items}
        fence = jobs.filter(pk__in=list(wanted), lease_owner=owner, state__in=Job.LEASED_STATES)
        rows = list(
            self.lock(fence.order_by("pk")).values_list(
                "pk", "attempts", "cancel_requested", "parent_id", "has_dependents", "has_children"
            )
        )
        report = FinishReport()
        mine = [r for r in rows if wanted[r[0]] == r[1]]
        self._sort_missing(report, wanted, {r[0] for r in mine}, owner)
        texts = {job_id: text for job_id, _, text in items}
        done = [r for r in mine if not r[2]]
        cancelled = [r for r in mine if r[2]]
        if done:
            ids = [r[0] for r in done]
            values = terminal_columns(Job.State.DONE)
            if any(texts[i] is not None for i in ids):
                # JSON text straight into the column: SQLite and MariaDB store JSON as text,
                # MySQL parses a string assigned to a JSON column.
                values["result"] = Case(
                    *(When(pk=i, then=Value(texts[i])) for i in ids if texts[i] is not None),
                    default=Value(None),
                    output_field=TextField(),
                )
            jobs.filter(pk__in=ids).update(**values)
        if cancelled:
            jobs.filter(pk__in=[r[0] for r in cancelled]).update(
                **terminal_columns(Job.State.CANCELLED)
            )
        for pk, _, cancel, parent_id, has_dependents, has_children in mine:
            state = Job.State.CANCELLED if cancel else Job.State.DONE
            report.finished.append(
                Finished(pk, str(state), parent_id, has_dependents, has_children)
            )
        return report

    def _sort_missing(
        self, report: FinishReport, wanted: dict[int, int], mine: set[int], owner: str
    ) -> None:
        """File the jobs of `wanted` not in `mine` as busy (locked elsewhere) or lost."""
        missing = sorted(set(wanted) - mine)
        if not missing:
            return
        still = dict(
            Job.objects.using(self.using)
            .filter(pk__in=missing, lease_owner=owner, state__in=Job.LEASED_STATES)
            .values_list("pk", "attempts")
        )
        gone = []
        for job_id in missing:
            if self.has_select_for_update_skip_locked and still.get(job_id) == wanted[job_id]:
                report.busy.append(job_id)
            else:
                gone.append(job_id)
        if not gone:
            return
        earlier = self.finished_by(owner, {job_id: wanted[job_id] for job_id in gone})
        for job_id in gone:
            if job_id in earlier:
                report.recorded.append((job_id, earlier[job_id]))
            else:
                report.lost.append(job_id)

    def finished_by(self, owner: str, wanted: dict[int, int]) -> dict[int, str]:
        """Return {job id: state} of the jobs of `wanted` (id: attempt) that `owner`'s lease
        of that attempt finished: `done`, or `cancelled` as a finish ends it.

        A write whose COMMIT was sent but whose reply was lost (the connection dropped) is
        retried, and then finds its own work done: that is not a lost lease. The claim of
        an attempt is the last to append to `worker_ids` and bumps `attempts`; a reclaim of
        that attempt records a lease error with its number; so a final row with this attempt,
        this owner last, and no error of this attempt was finished by this lease.
        """
        rows = (
            Job.objects.using(self.using)
            .filter(pk__in=list(wanted), state__in=(Job.State.DONE, Job.State.CANCELLED))
            .values_list("pk", "state", "attempts", "worker_ids", "last_error")
        )
        found = {}
        for pk, state, attempts, worker_ids, last_error in rows:
            if attempts != wanted[pk] or not worker_ids or worker_ids[-1] != owner:
                continue
            if isinstance(last_error, dict) and last_error.get("attempt") == attempts:
                continue  # this attempt failed (reclaimed): not finished by the lease
            found[pk] = str(state)
        return found

    def finish_simple(
        self, *, owner: str, items: Sequence[tuple[int, int, str | None]]
    ) -> list[Finished]:
        """Finish, in one autocommit statement, the jobs of `items` that need nothing else.

        Only where `autocommit_statements`; see PostgreSQLDialect.
        """
        raise NotImplementedError

    def suspend_sleeps(self, items: Sequence[tuple[int, str, int, float, list[Any]]]) -> list[int]:
        """Suspend, in one autocommit statement, the sleeping jobs of `items` that need
        nothing else; return the ids of those it suspended (now `scheduled`).

        Each item is (job id, lease owner, attempt, delay in seconds, records). Only where
        `autocommit_statements`; see PostgreSQLDialect.
        """
        raise NotImplementedError
