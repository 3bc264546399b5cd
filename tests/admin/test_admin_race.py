"""Admin actions against a live worker (a `jobqueue_worker` subprocess) on the same jobs."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

import django_jobqueue as jobqueue
from django_jobqueue.models import Job, Worker
from tests.conftest import assert_clean_log, poll, wait_for_job
from tests.support.admin_support import run_action, url
from tests.support.workflow_support import FAST
from tests.testapp.models import RunRecord

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_cancel_all_while_a_worker_runs_them(admin_client: Client, start_worker: Any) -> None:
    """Each job ends done or cancelled, never both, never stuck; the report adds up."""
    # 75 s of work for four threads: the cancel lands mid-run even when a loaded machine
    # takes many seconds over the admin's request (20 s of work were once done before it).
    jobs = [jobqueue.enqueue("test.record", {"sleep": 2.0}) for _ in range(150)]
    worker = start_worker("--concurrency", "4", *FAST)
    poll(lambda: Job.objects.filter(state="done").count() >= 10)
    data = {
        "action": "cancel_jobs",
        "select_across": "1",
        "index": "0",
        "_selected_action": [str(jobs[0].pk)],
        "jq_bulk_confirmed": "yes",  # 150 jobs: at most ACTION_LIMIT, done in the request
    }
    response = admin_client.post(url("job_changelist"), data, follow=True)
    [text] = [str(m) for m in response.context["messages"]]
    poll(lambda: not Job.objects.exclude(state__in=Job.TERMINAL_STATES).exists())
    rows = {job.pk: job for job in Job.objects.all()}
    ran = set(RunRecord.objects.values_list("job_id", flat=True))
    assert {row.state for row in rows.values()} <= {"done", "cancelled"}
    for pk, row in rows.items():
        assert row.lease_owner is None and row.finished_at is not None
        if row.state == "done":
            assert pk in ran
        elif pk in ran:  # it was running: cancelled cooperatively, its result discarded
            assert row.cancel_requested and row.result is None
    cancelled = sum(1 for row in rows.values() if row.state == "cancelled")
    assert cancelled >= 1
    changed = int(text.split()[1])
    skipped = int(text.split("Skipped ")[1].split(":")[0]) if "Skipped" in text else 0
    assert changed + skipped == 150
    assert changed == cancelled
    assert worker.stop() == 0
    assert_clean_log(worker.output())


def test_cancel_a_running_job_from_the_admin(admin_client: Client, start_worker: Any) -> None:
    worker = start_worker("--concurrency", "2", *FAST)
    job = jobqueue.enqueue("wf.until_cancelled", {"limit": 60})
    wait_for_job(job.pk, Job.State.RUNNING)
    _, [text] = run_action(admin_client, "livelease", "cancel_jobs", [job.pk])
    assert f"#{job.pk} cancel requested" in text
    row = wait_for_job(job.pk, *Job.TERMINAL_STATES)
    assert row.state == "cancelled" and row.result is None
    assert worker.stop() == 0
    assert_clean_log(worker.output())


def test_retry_from_the_admin_runs_the_job_again(admin_client: Client, start_worker: Any) -> None:
    worker = start_worker("--concurrency", "2", *FAST)
    job = jobqueue.enqueue("test.fail_then_succeed", {"failures": 1}, max_attempts=1)
    wait_for_job(job.pk, Job.State.DEAD)
    _, [text] = run_action(admin_client, "deadjob", "retry_jobs", [job.pk], extra_attempts="1")
    assert text.startswith("Retried 1 job")
    row = wait_for_job(job.pk, Job.State.DONE)
    assert row.attempts == 2 and row.result == "ok on attempt 2"
    assert worker.stop() == 0
    assert_clean_log(worker.output())


def test_release_refuses_a_job_its_live_worker_claimed_after_its_last_heartbeat(
    admin_client: Client, start_worker: Any
) -> None:
    """The worker's row does not list the job yet (it beats every 300 s): the job stays its."""
    worker = start_worker("--concurrency", "2", "--heartbeat-interval", "300", "--lease-ttl", "600")
    row = worker.wait_registered()
    job = jobqueue.enqueue("wf.until_cancelled", {"limit": 120})
    wait_for_job(job.pk, Job.State.RUNNING)
    # Claimed after its last heartbeat: the row does not list it. On a loaded machine the
    # worker's first beat (as its heartbeat starts) can come after the claim and list it, so
    # the row is set as it would be had the claim come after that beat (the next is 300 s off).
    Worker.objects.filter(pk=row.pk).update(job_ids=[])
    row.refresh_from_db()
    assert job.pk not in row.job_ids
    _, [text] = run_action(admin_client, "livelease", "release_leases", [job.pk])
    assert text.startswith("Released 0 jobs") and f"held by live worker {row.pk}" in text
    held = Job.objects.get(pk=job.pk)
    assert (held.state, held.lease_owner, held.attempts) == ("running", row.pk, 1)
    page = admin_client.get(url("job_change", job.pk)).content.decode()
    assert 'value="release_leases"' not in page and 'value="cancel_jobs"' in page
    run_action(admin_client, "livelease", "cancel_jobs", [job.pk])
    done = wait_for_job(job.pk, *Job.TERMINAL_STATES)
    assert (done.state, done.attempts) == ("cancelled", 1)
    assert RunRecord.objects.filter(job_id=job.pk).count() == 1  # it ran once
    assert worker.stop() == 0
    assert_clean_log(worker.output())
