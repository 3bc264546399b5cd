"""Crash recovery: a worker killed mid-job loses its lease, and another worker takes over."""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.db import OperationalError, connection, connections, transaction

import django_jobqueue as jobqueue
from django_jobqueue.models import Job, Worker
from tests.conftest import assert_clean_log, poll, wait_for_job
from tests.testapp.models import RunRecord

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# A short lease so that recovery takes seconds; the heartbeat keeps live leases alive.
SHORT_LEASE = ("--lease-ttl", "2", "--heartbeat-interval", "0.5")
LEASE_EXPIRED = "django_jobqueue.exceptions.LeaseExpired"


def holds_no_lock(job_id: int) -> bool:
    """Whether another session can lock job `job_id` now (on SQLite: take the write lock)."""
    if connection.vendor == "sqlite":
        other = sqlite3.connect(connection.settings_dict["NAME"], timeout=0.2)
        try:
            other.execute("BEGIN IMMEDIATE")
            other.rollback()
            return True
        except sqlite3.OperationalError:
            return False
        finally:
            other.close()
    try:
        with transaction.atomic():
            list(Job.objects.select_for_update(nowait=True).filter(pk=job_id))
        return True
    except OperationalError:
        return False


def pause(worker, job_id: int) -> None:
    """SIGSTOP `worker`, as a long GC pause or an overloaded host would stall it.

    A process stopped in the middle of a write (a heartbeat, say) would keep its lock, and
    stall the other workers too (a different test): retry until it stops outside one.
    """
    stat = Path(f"/proc/{worker.pid}/stat")
    for _ in range(100):
        worker.signal(signal.SIGSTOP)
        poll(lambda: stat.read_text().rsplit(")", 1)[1].split()[0] == "T")
        if holds_no_lock(job_id):
            return
        worker.signal(signal.SIGCONT)
        time.sleep(0.02)
    raise AssertionError("could not pause the worker outside a write")


def test_job_of_a_killed_worker_is_reclaimed_and_done_once(start_worker):
    job = jobqueue.enqueue("test.record", {"sleep": 3, "value": "ok"}, max_attempts=3)
    doomed = start_worker(*SHORT_LEASE)
    running = wait_for_job(job.pk, Job.State.RUNNING)
    doomed_id = running.lease_owner
    doomed.kill()  # SIGKILL mid-sleep: no outcome recorded, no lease released
    assert doomed.proc.returncode == -signal.SIGKILL
    # The lease still names the dead worker; only its expiry lets another worker in.
    assert Job.objects.get(pk=job.pk).lease_owner == doomed_id
    rescuer = start_worker(*SHORT_LEASE)

    done = wait_for_job(job.pk, Job.State.DONE, Job.State.DEAD, timeout=60)
    assert done.state == Job.State.DONE
    assert done.result == "ok"
    assert done.attempts == 2
    assert done.lease_owner is None
    assert done.last_error["type"] == LEASE_EXPIRED
    assert doomed_id in done.last_error["message"]
    assert [e["type"] for e in done.errors] == [LEASE_EXPIRED]
    assert done.worker_ids == [doomed_id, rescuer.row().id]
    # The killed attempt never finished; the reclaimed one ran exactly once, on the rescuer.
    assert list(RunRecord.objects.values_list("job_id", "attempt", "worker_pid")) == [
        (job.pk, 2, rescuer.pid)
    ]
    assert f"Reclaimed expired lease of job id={job.pk} -> scheduled" in rescuer.output()
    assert rescuer.stop() == 0


def test_stalled_worker_that_lost_its_lease_cannot_record_an_outcome(start_worker):
    """A worker frozen mid-job past its lease TTL wakes up after another worker reclaimed and
    finished the job: its late finish is fenced off by the attempt number and changes nothing."""
    # The job lasts long enough to be paused mid-run on a loaded machine too. The test is
    # about fencing, not the watchdog: without one, nothing can kill the resumed process in
    # the instant before its ticker runs again.
    job = jobqueue.enqueue("test.record", {"sleep": 5, "value": "once"}, max_attempts=3)
    stalled = start_worker(*SHORT_LEASE, "--no-watchdog")
    stalled_id = wait_for_job(job.pk, Job.State.RUNNING).lease_owner
    pause(stalled, job.pk)
    rescuer = start_worker(*SHORT_LEASE)
    done = wait_for_job(job.pk, Job.State.DONE, Job.State.DEAD, timeout=60)
    assert done.state == Job.State.DONE
    assert done.attempts == 2
    assert stalled_id in done.last_error["message"]
    finished = Job.objects.filter(pk=job.pk).values().get()

    stalled.signal(signal.SIGCONT)
    poll(lambda: f"Lost the lease on job id={job.pk}" in stalled.output(), timeout=60)
    assert Job.objects.filter(pk=job.pk).values().get() == finished
    # The stalled handler did run to its end: delivery is at least once, and each attempt's
    # side effects are told apart by the attempt number.
    runs = dict(RunRecord.objects.filter(job_id=job.pk).values_list("attempt", "worker_pid"))
    assert runs == {1: stalled.pid, 2: rescuer.pid}
    assert stalled.running()  # losing a lease is not fatal
    assert stalled.stop() == 0
    assert rescuer.stop() == 0


def test_row_of_a_killed_worker_is_swept_once_its_heartbeat_is_stale(start_worker):
    # TTL 2, not 1: at 1 the watchdog's quiet window is 0.5 s, and a loaded machine can stall
    # a live worker that long.
    doomed = start_worker(*SHORT_LEASE)
    doomed_id = doomed.wait_registered().id
    doomed.kill()
    assert Worker.objects.filter(pk=doomed_id).exists()  # nobody said goodbye
    # Another worker sweeps rows whose heartbeat is older than 4 of their own lease TTLs.
    sweeper = start_worker(*SHORT_LEASE)
    sweeper_id = sweeper.wait_registered().id
    poll(lambda: not Worker.objects.live().filter(pk=doomed_id).exists(), timeout=60)
    assert Worker.objects.gone().filter(pk=doomed_id).exists()  # kept a while, for the admin
    assert Worker.objects.live().filter(pk=sweeper_id).exists()
    assert sweeper.stop() == 0


def test_killing_a_busy_worker_loses_no_job(start_worker):
    """Two workers share 30 jobs; one is SIGKILLed while running some. Every job still ends
    done, each attempt ran at most once, and only the killed worker's jobs were re-run."""
    ids = [jobqueue.enqueue("test.record", {"sleep": 0.4}).pk for _ in range(30)]
    doomed = start_worker("--concurrency", "2", *SHORT_LEASE)
    survivor = start_worker("--concurrency", "2", *SHORT_LEASE)
    doomed_id = doomed.wait_registered().id
    survivor.wait_registered()
    poll(lambda: RunRecord.objects.filter(worker_pid=doomed.pid).count() >= 2, timeout=60)
    poll(lambda: Job.objects.filter(state=Job.State.RUNNING, lease_owner=doomed_id).exists())
    doomed.kill()

    def all_done() -> bool:
        return Job.objects.filter(pk__in=ids, state=Job.State.DONE).count() == len(ids)

    poll(all_done, timeout=120, interval=0.2)
    assert survivor.stop() == 0
    retried = Job.objects.filter(attempts__gt=1)
    assert retried.exists()  # the killed worker held jobs, and they were reclaimed
    assert all(j.last_error["type"] == LEASE_EXPIRED for j in retried)
    assert all(doomed_id in j.last_error["message"] for j in retried)
    assert set(Job.objects.values_list("attempts", flat=True)) <= {1, 2}
    for job in Job.objects.all():
        runs = dict(RunRecord.objects.filter(job_id=job.pk).values_list("attempt", "worker_pid"))
        # The attempt that finished the job ran (exactly once, by the unique constraint) ...
        assert job.attempts in runs
        if job.attempts > 1:
            assert runs[job.attempts] == survivor.pid
        # ... and an earlier attempt can only have run on the worker that was killed.
        assert all(pid == doomed.pid for attempt, pid in runs.items() if attempt < job.attempts)
    assert_clean_log(survivor.output())


def test_job_that_crashes_its_worker_once_is_retried_and_completes(start_worker, tmp_path):
    marker = tmp_path / "crashed"
    job = jobqueue.enqueue("test.crash_once", {"marker": str(marker)}, max_attempts=3)
    first = start_worker(*SHORT_LEASE)
    assert first.wait(60) == 137  # the handler took the whole process down
    assert marker.read_text() == str(first.pid)
    second = start_worker(*SHORT_LEASE)
    done = wait_for_job(job.pk, Job.State.DONE, Job.State.DEAD, timeout=60)
    assert done.state == Job.State.DONE
    assert done.result == "survived"
    assert done.attempts == 2
    assert done.last_error["type"] == LEASE_EXPIRED
    assert second.stop() == 0


def test_job_that_always_crashes_its_worker_is_dead_after_max_attempts(start_worker):
    """Each attempt kills its worker; a supervisor restarts workers. After max_attempts
    reclaims the job is dead, and the next worker lives on instead of crash-looping."""
    job = jobqueue.enqueue("test.crash_always", max_attempts=2)
    crashes = 0
    workers = []
    while True:
        worker = start_worker(*SHORT_LEASE)
        workers.append(worker)

        def settled(worker=worker) -> bool:
            return not worker.running() or Job.objects.get(pk=job.pk).state == Job.State.DEAD

        poll(settled, timeout=60)
        if worker.running():
            break
        assert worker.proc.returncode == 137
        crashes += 1
        assert crashes <= 2, "the job crashed more workers than it has attempts"
    assert crashes == 2
    dead = Job.objects.get(pk=job.pk)
    assert dead.state == Job.State.DEAD
    assert dead.attempts == 2
    assert dead.finished_at is not None
    assert dead.last_error["type"] == LEASE_EXPIRED
    assert dead.last_error["attempt"] == 2
    assert [(e["type"], e["attempt"]) for e in dead.errors] == [
        (LEASE_EXPIRED, 1),
        (LEASE_EXPIRED, 2),
    ]
    # The surviving worker keeps serving the queue.
    after = jobqueue.enqueue("test.add", {"a": 1, "b": 2})
    assert wait_for_job(after.pk, Job.State.DONE, Job.State.DEAD).result == 3
    assert worker.running()
    assert worker.stop() == 0

    # The last crashed worker's watchdog reclaims its lease at once (issue 53); had it failed
    # to, the surviving worker's reclaimer would have, once the lease ran out.
    def told() -> bool:
        logs = "\n".join(w.output() for w in workers)
        return ("Reclaimed 1 job(s) of dead worker" in logs
                or f"Reclaimed expired lease of job id={job.pk} -> dead" in logs)  # fmt: skip

    poll(told, timeout=30)


@contextmanager
def heartbeat_blocked(worker_id: str) -> Iterator[None]:
    """Hold what `worker_id`'s heartbeat must write (its row; on SQLite the write lock)."""
    if connection.vendor == "sqlite":
        other = sqlite3.connect(connection.settings_dict["NAME"], timeout=30)
        try:
            other.execute("BEGIN IMMEDIATE")
            yield
        finally:
            other.rollback()
            other.close()
        return
    locked, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold() -> None:
        try:
            with transaction.atomic():
                list(Worker.objects.select_for_update().filter(pk=worker_id))
                locked.set()
                release.wait(60)
        except BaseException as exc:  # surfaced below
            errors.append(exc)
            locked.set()
        finally:
            connections.close_all()

    thread = threading.Thread(target=hold)
    thread.start()
    assert locked.wait(30)
    try:
        yield
    finally:
        release.set()
        thread.join(60)
    assert not errors, errors


def test_worker_whose_heartbeat_failed_once_still_reclaims_a_killed_workers_job(start_worker):
    """One failed beat, then beats succeed again: after a lease TTL of them the worker judges
    others again, and takes back the job of a worker killed afterwards."""
    # A beat waits at most half an interval for a lock (1 s), and a success within two
    # intervals of the last one counts as no gap: the short failure below stays inside it.
    rescuer = start_worker("--lease-ttl", "4", "--heartbeat-interval", "2", "--queue", "other")
    rescuer_id = rescuer.wait_registered().id
    # Its first beat after registering has succeeded: the next failure follows a success.
    poll(lambda: (row := rescuer.row()) is not None and row.heartbeat_at > row.started_at)
    with heartbeat_blocked(rescuer_id):
        poll(lambda: "Worker duty heartbeat failed" in rescuer.output(), timeout=60)
    job = jobqueue.enqueue("test.record", {"sleep": 10}, queue="victim", max_attempts=3)
    doomed = start_worker("--queue", "victim", *SHORT_LEASE)
    doomed_id = wait_for_job(job.pk, Job.State.RUNNING).lease_owner
    doomed.kill()

    def reclaimed() -> bool:
        return f"Reclaimed expired lease of job id={job.pk}" in rescuer.output()

    poll(reclaimed, timeout=90, interval=0.2)
    back = Job.objects.get(pk=job.pk)
    assert back.state in (Job.State.SCHEDULED, Job.State.READY)
    assert back.lease_owner is None
    assert back.last_error["type"] == LEASE_EXPIRED
    assert doomed_id in back.last_error["message"]
    assert rescuer.stop() == 0
