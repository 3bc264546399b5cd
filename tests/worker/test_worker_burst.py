"""`jobqueue_worker --burst` exits only when nothing is runnable by the database's own view.

No ready job it can claim, no due scheduled job, no expired lease of a gone worker that it
could reclaim: each test runs real worker processes, and kills some of them with SIGKILL.
"""

from __future__ import annotations

import datetime as dt

import pytest

import django_jobqueue as jobqueue
from django_jobqueue.models import Job, Worker
from django_jobqueue.models.functions import DbNow
from tests.conftest import assert_clean_log, poll, wait_for_job
from tests.testapp.models import RunRecord

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SHORT_LEASE = ("--lease-ttl", "2", "--heartbeat-interval", "0.5")
LEASE_EXPIRED = "django_jobqueue.exceptions.LeaseExpired"
KILLED = 137  # the exit status of a handler's os._exit(137)


def wait_until_owner_is_gone(pk: int) -> None:
    """Return once job `pk` is not held by a live-looking worker: if it is in flight, its
    lease and its owner's row have both expired by the database clock."""

    def gone() -> bool:
        job = Job.objects.get(pk=pk)
        if job.state not in Job.LEASED_STATES:
            return True
        if not Job.objects.filter(pk=pk).expired().exists():
            return False
        return not Worker.objects.filter(pk=job.lease_owner, expires_at__gt=DbNow()).exists()

    poll(gone, timeout=60, interval=0.1)


def test_burst_worker_reclaims_and_runs_the_job_of_a_killed_worker(start_worker):
    job = jobqueue.enqueue("test.record", {"sleep": 3, "value": "ok"}, max_attempts=3)
    doomed = start_worker(*SHORT_LEASE)
    doomed_id = wait_for_job(job.pk, Job.State.RUNNING).lease_owner
    doomed.kill()
    wait_until_owner_is_gone(job.pk)
    assert Job.objects.get(pk=job.pk).state == Job.State.RUNNING  # nobody took it back yet

    burst = start_worker("--burst", *SHORT_LEASE)
    assert burst.wait(120) == 0
    done = Job.objects.get(pk=job.pk)
    assert done.state == Job.State.DONE, (done.state, done.lease_owner)
    assert (done.result, done.attempts) == ("ok", 2)
    assert done.last_error["type"] == LEASE_EXPIRED
    assert doomed_id in done.last_error["message"]
    assert list(RunRecord.objects.values_list("job_id", "attempt", "worker_pid")) == [
        (job.pk, 2, burst.pid)
    ]
    text = burst.output()
    assert f"Reclaimed expired lease of job id={job.pk} -> scheduled" in text
    assert_clean_log(text)


def test_job_that_always_kills_its_worker_is_dead_under_burst_workers(start_worker):
    """Each burst worker that runs the job dies with it; its watchdog reclaims the job at once
    (or the next worker, started once the lease has run out), and the next one runs it again,
    until its attempts are spent."""
    job = jobqueue.enqueue("test.crash_always", max_attempts=2)
    codes, workers = [], []
    for _ in range(6):  # bounded: three are enough
        wait_until_owner_is_gone(job.pk)
        worker = start_worker("--burst", *SHORT_LEASE)
        workers.append(worker)
        codes.append(worker.wait(120))
        if Job.objects.get(pk=job.pk).state == Job.State.DEAD:
            break
    # Two deaths; a third worker only if the second's watchdog could not reclaim.
    assert codes[:2] == [KILLED, KILLED] and codes[2:] in ([], [0]), codes

    def told() -> bool:  # a watchdog logs its reclaim just after it commits
        text = "\n".join(w.output() for w in workers)
        return ("Reclaimed 1 job(s) of dead worker" in text
                or f"Reclaimed expired lease of job id={job.pk} -> dead" in text)  # fmt: skip

    poll(told, timeout=30)
    dead = Job.objects.get(pk=job.pk)
    assert (dead.state, dead.attempts) == (Job.State.DEAD, 2)
    assert [(e["type"], e["attempt"]) for e in dead.errors] == [
        (LEASE_EXPIRED, 1),
        (LEASE_EXPIRED, 2),
    ]


def test_burst_worker_runs_a_job_that_became_due_before_it_started(start_worker):
    """The promoter thread may make the job ready before the dispatcher looks: the burst
    worker still runs it, each of ten times."""
    for _ in range(10):
        job = jobqueue.enqueue("test.noop", run_after=dt.timedelta(milliseconds=200))
        assert Job.objects.get(pk=job.pk).state == Job.State.SCHEDULED
        poll(lambda job=job: Job.objects.due().filter(pk=job.pk).exists(), timeout=30)
        worker = start_worker("--burst")
        assert worker.wait(120) == 0
        finished = Job.objects.get(pk=job.pk)
        assert finished.state == Job.State.DONE, finished.state
        assert_clean_log(worker.output())
