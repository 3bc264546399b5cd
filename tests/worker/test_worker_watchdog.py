"""The watchdog: a worker frozen by a handler that holds the GIL is killed before its leases
can run out, its jobs are reclaimed at once (charged), and none of them runs twice at once.

Real worker processes; the freezing handler is a catastrophic regular expression
(`test.hold_gil`), which would hold the GIL for hours: every test ends because the watchdog
kills it (or the fixture does).
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest

import django_jobqueue as jobqueue
from django_jobqueue.models import Job
from tests.conftest import poll, wait_for_job
from tests.testapp.models import RunRecord

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# The watchdog kills a silent worker a quarter TTL (1 s) before its row could expire.
LEASE = ("--lease-ttl", "4", "--heartbeat-interval", "1")
# Where the watchdog must also reclaim before the leases run out: it kills, waits for the
# process to be gone, connects and reclaims within the quarter TTL of margin. 1 s was too
# little on a loaded machine (the rescuer reclaimed the expired leases first); 3 s is not.
ROOMY_LEASE = ("--lease-ttl", "12", "--heartbeat-interval", "1")
KILLED = "killed by its watchdog"


def children(pid: int) -> list[int]:
    """The pids of the live watchdog processes of worker `pid` (named jobqueue-watch)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            comm = (stat.parent / "comm").read_text().strip()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] not in ("Z", "X") and comm == "jobqueue-watch":
            found.append(int(stat.parent.name))
    return found


def test_frozen_worker_is_killed_before_another_worker_can_run_its_jobs(start_worker):
    """A worker at --concurrency 2 runs a long job and a GIL-holding one. It is killed before
    its leases expire; the long job's second run starts only once the first process is dead."""
    probe = jobqueue.enqueue("test.overlap_probe", {"first_sleep": 600}, max_attempts=3)
    frozen = start_worker(
        *ROOMY_LEASE, "--concurrency", "2", "--queue", "default", "--queue", "gil"
    )
    poll(lambda: RunRecord.objects.filter(job_id=probe.pk, attempt=1).exists())
    frozen_id = Job.objects.get(pk=probe.pk).lease_owner
    # Ready to rerun the long job (not the poison one) as soon as it may.
    rescuer = start_worker(*ROOMY_LEASE, "--queue", "default")
    rescuer.wait_registered()
    poison = jobqueue.enqueue("test.hold_gil", queue="gil", max_attempts=1)

    done = wait_for_job(probe.pk, Job.State.DONE, Job.State.DEAD, timeout=120)
    assert done.state == Job.State.DONE
    assert done.result == [], "the second run started while the first process was alive"
    assert done.attempts == 2
    assert frozen_id in done.last_error["message"]
    runs = dict(RunRecord.objects.filter(job_id=probe.pk).values_list("attempt", "worker_pid"))
    assert runs[1] == frozen.pid

    assert frozen.wait(60) == -signal.SIGKILL
    dead = wait_for_job(poison.pk, Job.State.DEAD)
    assert dead.attempts == 1
    assert "ran no Python code" in frozen.output()
    # The watchdog reclaims at once whatever is left when the frozen process is gone. With a
    # margin of a quarter TTL for "kill, wait until gone, connect, reclaim", a loaded machine
    # can let the row expire first; the rescuer's reclaimer then takes a job, after the kill
    # all the same (the probe's result above), as it does when it finds the killed process
    # gone from this host. Each job is reclaimed once, by one of them.
    found = re.search(r"Reclaimed (\d) job\(s\) of killed worker", frozen.output())
    assert found, frozen.output()
    by_rescuer = rescuer.output().count("Reclaimed expired lease")
    assert int(found[1]) + by_rescuer == 2
    for job in (done, dead):
        message = job.last_error["message"]
        assert KILLED in message or "expired" in message or "found its process gone" in message
    assert rescuer.stop() == 0


def test_job_that_freezes_every_worker_is_dead_after_max_attempts(start_worker):
    """Each attempt freezes its worker, which is killed and restarted (here by the test, as a
    process manager would); after max_attempts the job is dead and the next worker lives on."""
    job = jobqueue.enqueue("test.hold_gil", max_attempts=2)
    kills = 0
    while True:
        worker = start_worker(*LEASE)

        def settled(worker=worker) -> bool:
            return not worker.running() or Job.objects.get(pk=job.pk).state == Job.State.DEAD

        poll(settled, timeout=90)
        if worker.running():
            break
        assert worker.proc.returncode == -signal.SIGKILL, worker.output()
        kills += 1
        assert kills <= 2, "the job froze more workers than it has attempts"
    assert kills == 2
    dead = Job.objects.get(pk=job.pk)
    assert dead.state == Job.State.DEAD
    assert dead.attempts == 2
    assert [KILLED in error["message"] for error in dead.errors] == [True, True]
    after = jobqueue.enqueue("test.add", {"a": 1, "b": 2})
    assert wait_for_job(after.pk, Job.State.DONE).result == 3
    assert worker.stop() == 0


def test_sigterm_drains_a_guarded_worker_and_its_watchdog_leaves(start_worker):
    job = jobqueue.enqueue("test.sleep", {"seconds": 1.5})
    worker = start_worker(*LEASE)
    wait_for_job(job.pk, Job.State.RUNNING)
    watchdogs = poll(lambda: children(worker.pid))
    assert len(watchdogs) == 1
    assert worker.stop(timeout=60) == 0
    assert Job.objects.get(pk=job.pk).state == Job.State.DONE
    assert not children(worker.pid)
    poll(lambda: not any(Path(f"/proc/{pid}").exists() for pid in watchdogs), timeout=10)


def test_busy_python_handler_is_not_killed(start_worker):
    """A handler that keeps the CPU busy in Python code lets the ticker run: no kill."""
    job = jobqueue.enqueue("test.spin", {"seconds": 10}, max_attempts=1)
    worker = start_worker(*LEASE)
    done = wait_for_job(job.pk, Job.State.DONE, Job.State.DEAD, timeout=90)
    assert done.state == Job.State.DONE, done.last_error
    assert done.attempts == 1
    assert worker.stop() == 0
    assert "ran no Python code" not in worker.output()


def test_no_watchdog_runs_the_worker_alone(start_worker):
    worker = start_worker(*LEASE, "--no-watchdog")
    worker.wait_registered()
    assert not children(worker.pid)
    assert worker.stop() == 0


def test_a_killed_workers_jobs_run_again_at_once_not_a_lease_later(start_worker):
    """SIGKILL (the OOM killer, say) ends a worker whose leases have two minutes left: its
    watchdog, re-parented only once every thread of it has ended, reclaims its job at once,
    and another worker runs it again within seconds; the two runs never overlap."""
    long_lease = ("--lease-ttl", "120", "--heartbeat-interval", "1")
    probe = jobqueue.enqueue("test.overlap_probe", {"first_sleep": 600}, max_attempts=3)
    doomed = start_worker(*long_lease)
    poll(lambda: RunRecord.objects.filter(job_id=probe.pk, attempt=1).exists())
    rescuer = start_worker(*long_lease)
    rescuer.wait_registered()
    doomed.signal(signal.SIGKILL)  # the worker alone: its watchdog lives on
    assert doomed.wait(60) == -signal.SIGKILL
    # Well inside the two minutes the lease had left: the watchdog reclaimed it, or the
    # rescuer found the process gone from this host first (never the lease's expiry).
    done = wait_for_job(probe.pk, Job.State.DONE, Job.State.DEAD, timeout=90)
    assert (done.state, done.attempts, done.result) == (Job.State.DONE, 2, [])
    assert "died during attempt 1" in done.last_error["message"]
    assert "gone without stopping" in doomed.output()


def test_a_worker_started_on_the_host_of_a_killed_one_runs_its_jobs_at_once(start_worker):
    """No watchdog outlives this worker (`--no-watchdog`: as if the whole process group had
    been killed). A worker started on the same host finds the killed one's process gone and
    takes its job back at once, not once the 30 s lease has run out; the runs never overlap."""
    lease = ("--lease-ttl", "30", "--heartbeat-interval", "1", "--no-watchdog")
    probe = jobqueue.enqueue("test.overlap_probe", {"first_sleep": 600}, max_attempts=3)
    doomed = start_worker(*lease)
    poll(lambda: RunRecord.objects.filter(job_id=probe.pk, attempt=1).exists())
    doomed.signal(signal.SIGKILL)
    assert doomed.wait(60) == -signal.SIGKILL
    killed = time.monotonic()
    rescuer = start_worker(*lease)
    done = wait_for_job(probe.pk, Job.State.DONE, Job.State.DEAD, timeout=90)
    # The lease had 29 s or more left: a reclaim by its expiry comes later than this.
    assert time.monotonic() - killed < 25, rescuer.output()
    assert (done.state, done.attempts, done.result) == (Job.State.DONE, 2, [])
    assert "found its process gone" in done.last_error["message"]
    assert "is gone from this host" in rescuer.output()
