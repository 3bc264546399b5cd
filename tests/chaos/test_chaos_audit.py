"""The chaos suite's audit can fail: it sees a lost job, a second finalization, a late run."""

from __future__ import annotations

import random

import pytest

from django_jobqueue.models import Job
from tests.chaos.support import audit, build_workload
from tests.support.workflow_support import drain
from tests.testapp.models import RunRecord

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.chaos]


def test_audit_of_a_clean_run_finds_nothing_and_of_a_tampered_one_finds_each_fault():
    work = build_workload(random.Random(1), independent=100, boxes=2, per_box=3)
    drain(concurrency=2)
    clean = audit(work)
    assert clean.problems == []
    assert (clean.lost, clean.reruns, clean.reclaimed) == (0, 0, 0)
    assert clean.jobs == len(work.ids) == 100 + 1 + 2 * (1 + 3 + 1 + 3 + 1) + 1 + 7

    done = Job.objects.filter(pk__in=work.ids, state=Job.State.DONE, is_container=False)
    overwritten, lost, late = done.order_by("pk")[:3]
    # An earlier attempt's finish landing after the last one's: the result names attempt 0.
    Job.objects.filter(pk=overwritten.pk).update(
        result={**overwritten.result, "attempt": overwritten.attempts - 1}
    )
    Job.objects.filter(pk=lost.pk).update(state=Job.State.READY, finished_at=None)
    RunRecord.objects.create(job_id=late.pk, attempt=late.attempts + 1, worker_pid=1)

    tampered = audit(work)
    assert tampered.lost == 1
    assert tampered.reruns == 1
    text = "\n".join(tampered.problems)
    assert f"job {overwritten.pk}: outcome" in text
    assert f"job {lost.pk}: expected done, found ready" in text
    assert f"job {late.pk}: a run of an attempt after the row's" in text
