"""Many worker processes on one queue: every job runs exactly once, on every database."""

from __future__ import annotations

import pytest
from django.db import transaction

import django_jobqueue as jobqueue
from django_jobqueue.models import Job, Worker
from tests.conftest import assert_clean_log, poll, wait_for_job
from tests.testapp.models import RunRecord

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WORKERS = 4
CONCURRENCY = 2


def race(start_worker, jobs: int, groups: tuple[str, ...] = ("",)) -> None:
    """Start WORKERS processes, give them `jobs` test.record jobs at once, and prove that each
    job ran exactly once.

    test.record inserts (job id, attempt) under a unique constraint, so a second run of the
    same attempt would fail its insert, and a re-run under a new attempt would leave a second
    record: exactly `jobs` records, all of attempt 1, prove one dispatch per job.
    """
    workers = [start_worker("--concurrency", str(CONCURRENCY)) for _ in range(WORKERS)]
    for worker in workers:
        worker.wait_registered()
    assert Worker.objects.count() == WORKERS

    # One commit makes all the jobs visible at once, to workers that are already polling.
    with transaction.atomic():
        ids = {
            jobqueue.enqueue(
                "test.record", group=groups[i % len(groups)], weight=1 + i % len(groups)
            ).pk
            for i in range(jobs)
        }

    def all_done() -> bool:
        claimed_twice = Job.objects.filter(attempts__gt=1).count()
        assert not claimed_twice, f"{claimed_twice} job(s) were claimed more than once"
        return Job.objects.filter(state=Job.State.DONE).count() == jobs

    poll(all_done, timeout=180, interval=0.25)
    for worker in workers:
        assert worker.stop() == 0, worker.output()

    assert Job.objects.exclude(state=Job.State.DONE).count() == 0
    assert set(Job.objects.values_list("attempts", flat=True)) == {1}
    assert RunRecord.objects.count() == jobs
    assert set(RunRecord.objects.values_list("job_id", flat=True)) == ids
    assert set(RunRecord.objects.values_list("attempt", flat=True)) == {1}
    # The race was real: several processes claimed from the same jobs. (Not necessarily all
    # of them: a worker claims up to 128 short jobs at once, and on a busy machine two workers
    # could drain the 600 jobs of the fair-share race before the others were scheduled.)
    pids = set(RunRecord.objects.values_list("worker_pid", flat=True))
    assert pids <= {w.pid for w in workers} and len(pids) >= 2, pids
    # No worker hit lock trouble it could not absorb (on SQLite: no "database is locked").
    for worker in workers:
        assert_clean_log(worker.output())
    # Clean exits mark their Worker rows gone.
    assert not Worker.objects.live().exists()


def test_contending_workers_run_every_job_exactly_once(start_worker):
    """4 processes x 2 threads race for 2000 jobs: none is dispatched twice, none is lost.

    On SQLite the same run proves that BEGIN IMMEDIATE plus the busy retry keeps
    "database is locked" out of the workers' logs under contention.
    """
    race(start_worker, jobs=2000)


def test_contending_workers_claiming_by_fair_share_run_every_job_exactly_once(start_worker):
    """The same race through the fair-share claim path (several groups, weights 1-3), which
    locks its candidate rows group by group."""
    race(start_worker, jobs=600, groups=("a", "b", "c"))


def test_heartbeat_keeps_a_job_longer_than_the_lease_ttl_from_being_reclaimed(start_worker):
    """A job runs for over two lease TTLs while another worker sweeps for expired leases every
    0.2 s: the heartbeat renews the lease, so the job is never reclaimed or run twice."""
    short_lease = ("--lease-ttl", "2", "--heartbeat-interval", "0.4")
    runner = start_worker(*short_lease)
    # The sweeper claims nothing (a queue of its own) and is sweeping before the job starts: a
    # loaded machine can take longer to start a process than the job runs.
    sweeper = start_worker(*short_lease, "--queue", "sweeper-only")
    runner.wait_registered()
    sweeper.wait_registered()
    job = jobqueue.enqueue("test.record", {"sleep": 4.5, "value": "long"})
    wait_for_job(job.pk, Job.State.RUNNING)
    done = wait_for_job(job.pk, Job.State.DONE, Job.State.DEAD)
    assert done.state == Job.State.DONE
    assert done.result == "long"
    assert done.attempts == 1
    assert done.last_error is None
    assert list(RunRecord.objects.values_list("attempt", "worker_pid")) == [(1, runner.pid)]
    assert runner.stop() == 0
    assert sweeper.stop() == 0
    assert "Reclaimed" not in sweeper.output() + runner.output()
