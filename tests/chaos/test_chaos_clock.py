"""A worker whose clock runs minutes ahead reclaims nothing that is alive: leases, heartbeats
and the reclaimer's judgement all use the database's clock."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import django_jobqueue as jobqueue
from django_jobqueue.models import Job, Worker
from tests.chaos.support import LEASE_EXPIRED
from tests.conftest import assert_clean_log, poll, wait_for_job
from tests.testapp.models import RunRecord

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.chaos, pytest.mark.slow]

AHEAD = 600.0  # ten minutes: two hundred lease TTLs
SHORT_LEASE = ("--lease-ttl", "2", "--heartbeat-interval", "0.5")
SKEW = Path(__file__).resolve().parent / "skewed_clock"


def skewed_env(offset: float) -> dict[str, str]:
    """The environment of a worker whose wall clock runs `offset` seconds ahead."""
    path = os.pathsep.join(p for p in (str(SKEW), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "JOBQUEUE_CHAOS_CLOCK_OFFSET": str(offset)}


def long_jobs(count: int, seconds: float, queue: str = "default") -> list[int]:
    return [
        jobqueue.enqueue("test.record", {"sleep": seconds, "value": n}, queue=queue).pk
        for n in range(count)
    ]


def holding(worker, count: int) -> None:
    """Wait until `worker` runs `count` jobs."""
    worker_id = worker.wait_registered().id
    poll(
        lambda: Job.objects.filter(state=Job.State.RUNNING, lease_owner=worker_id).count() >= count,
        timeout=60,
    )


def test_worker_with_clock_minutes_ahead_reclaims_no_live_lease(start_worker, chaos_report):
    # Each worker has a queue of its own: on a loaded machine the skewed worker can take
    # longer to start than the normal one's jobs last, and the normal one must not take its
    # jobs meanwhile. A reclaimer looks at every queue's leases all the same.
    normal = start_worker("--concurrency", "2", "--queue", "default", *SHORT_LEASE)
    normal_jobs = long_jobs(2, 8)
    holding(normal, 2)
    ahead = start_worker(
        "--concurrency", "2", "--queue", "ahead", *SHORT_LEASE, env=skewed_env(AHEAD)
    )
    ahead_jobs = long_jobs(2, 6, queue="ahead")
    holding(ahead, 2)

    # Four lease TTLs pass while both run; each side's reclaimer looks every 0.2s.
    for pk in normal_jobs + ahead_jobs:
        done = wait_for_job(pk, Job.State.DONE, Job.State.DEAD, timeout=90)
        assert done.state == Job.State.DONE
        assert done.attempts == 1, done.last_error
        assert done.errors == []
    runs = dict(
        RunRecord.objects.filter(job_id__in=normal_jobs + ahead_jobs).values_list(
            "job_id", "worker_pid"
        )
    )
    assert runs == {
        **dict.fromkeys(normal_jobs, normal.pid),
        **dict.fromkeys(ahead_jobs, ahead.pid),
    }
    # The skew was in effect in the handler's process (time.time() there ran ahead).
    skewed = RunRecord.objects.filter(job_id__in=ahead_jobs).values_list("started", flat=True)
    assert all(started > time.time() + AHEAD / 2 for started in skewed)
    assert normal.stop() == 0

    # The skewed reclaimer is alive and judges by the database: the job of a worker killed
    # for real (on a queue the skewed worker does not serve) is taken back by it, and only
    # once its lease has expired.
    doomed = start_worker("--concurrency", "1", "--queue", "orphans", *SHORT_LEASE)
    (orphan,) = long_jobs(1, 30, queue="orphans")
    doomed_id = wait_for_job(orphan, Job.State.RUNNING).lease_owner
    # As if it ran on another host: nothing proves its process gone, the lease rules (a
    # worker of this host would take back its jobs at once, by its pid).
    Worker.objects.filter(pk=doomed_id).update(process_key="")
    doomed.kill()
    killed_at = time.monotonic()
    back = wait_for_job(orphan, Job.State.SCHEDULED, Job.State.READY, timeout=60)
    waited = time.monotonic() - killed_at
    assert waited > 1.0  # not before the 2s lease could expire (minus polling slack)
    assert [e["type"] for e in back.errors] == [LEASE_EXPIRED]
    assert doomed_id in back.errors[0]["message"]
    assert back.attempts == 1
    # The reclaimer logs once its transaction has committed: the line can trail the row.
    poll(lambda: f"Reclaimed expired lease of job id={orphan}" in ahead.output(), timeout=30)
    assert not RunRecord.objects.filter(job_id=orphan).exists()
    assert ahead.stop() == 0
    assert_clean_log(ahead.output())
    assert_clean_log(normal.output())
    chaos_report(
        "clock-ahead",
        offset_seconds=round(AHEAD),
        live_jobs=len(normal_jobs + ahead_jobs),
        reclaimed_alive=0,
        run_twice=0,
        dead_worker_reclaimed_after_s=round(waited, 1),
    )
