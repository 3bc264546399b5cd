"""Cancelling running work: cooperative, seen by the handler, its result discarded."""

from __future__ import annotations

import pytest

import django_jobqueue as jobqueue
from django_jobqueue.models import Job
from tests.conftest import assert_clean_log, wait_for_job
from tests.support.workflow_support import FAST, states
from tests.testapp.models import RunRecord

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FINAL = Job.TERMINAL_STATES


def test_cancel_running_job_is_cooperative_and_discards_its_result(start_worker):
    worker = start_worker("--concurrency", "2", *FAST)
    job = jobqueue.enqueue("wf.until_cancelled", {"limit": 60})
    down = jobqueue.enqueue("wf.step", depends_on=[job])
    wait_for_job(job.pk, Job.State.RUNNING)

    assert jobqueue.cancel(job) is True
    # Not final at once: the handler is still running, and only it knows how to stop; its
    # downstream waits meanwhile. Read in one snapshot: on a loaded machine the handler may
    # have stopped already, and then the job and its downstream ended together.
    snapshot = dict(Job.objects.filter(pk__in=[job.pk, down.pk]).values_list("pk", "state"))
    if snapshot[job.pk] in Job.LEASED_STATES:
        assert snapshot[down.pk] == "waiting"
    else:
        assert (snapshot[job.pk], snapshot[down.pk]) == ("cancelled", "cancelled")
    assert Job.objects.get(pk=job.pk).cancel_requested

    row = wait_for_job(job.pk, *FINAL)
    assert row.state == "cancelled"
    # The handler saw ctx.cancelled and returned normally (on its safety timeout it would
    # have raised, leaving last_error); what it returned was thrown away.
    assert row.result is None and row.last_error is None
    assert RunRecord.objects.filter(job_id=job.pk).count() == 1
    assert row.lease_owner is None and row.finished_at is not None
    assert states(down) == ("cancelled",)
    assert down.cancelled_by_id == job.pk
    assert down.last_error["message"] == f"upstream job {job.pk} ended cancelled"
    assert jobqueue.cancel(job) is False
    assert worker.stop() == 0
    assert_clean_log(worker.output())


def test_cancel_container_cancels_waiting_children_now_and_running_ones_cooperatively(
    start_worker,
):
    worker = start_worker("--concurrency", "2", *FAST)
    with jobqueue.container("batch") as batch:
        running = jobqueue.enqueue("wf.until_cancelled", {"limit": 60}, parent=batch)
        blocked = jobqueue.enqueue("wf.step", parent=batch, depends_on=[running])
    after = jobqueue.enqueue("wf.step", depends_on=[batch])
    wait_for_job(running.pk, Job.State.RUNNING)

    assert jobqueue.cancel(batch) is True
    assert states(batch, blocked, after) == ("cancelled",) * 3
    assert after.cancelled_by_id == batch.pk
    assert Job.objects.get(pk=running.pk).cancel_requested

    row = wait_for_job(running.pk, *FINAL)
    assert row.state == "cancelled" and row.result is None and row.last_error is None
    assert states(batch) == ("cancelled",)  # the late child does not roll it up again
    assert not RunRecord.objects.filter(job_id__in=[blocked.pk, after.pk]).exists()
    assert worker.stop() == 0
    assert_clean_log(worker.output())
