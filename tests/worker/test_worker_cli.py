"""The jobqueue_worker command's options: --max-jobs, --burst, --queue, --help, bad values."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import time

import pytest

import django_jobqueue as jobqueue
from django_jobqueue.management.commands.jobqueue_worker import Command
from django_jobqueue.models import Job, Worker
from tests.conftest import (
    ROOT,
    SKIPPED_BEAT,
    assert_clean_log,
    poll,
    run_worker_command,
    wait_for_job,
)

TERMINAL = (Job.State.DONE, Job.State.DEAD)


def run_command(*args: str) -> subprocess.CompletedProcess[str]:
    return run_worker_command(*args)


def worker_options() -> list[str]:
    """The long options the command itself defines (not Django's common ones)."""
    parser = Command().create_parser("manage.py", "jobqueue_worker")
    own = [a for a in parser._actions if a.dest not in _DJANGO_COMMON and a.option_strings]
    return [next(o for o in a.option_strings if o.startswith("--")) for a in own]


_DJANGO_COMMON = {
    "help",
    "version",
    "verbosity",
    "settings",
    "pythonpath",
    "traceback",
    "no_color",
    "force_color",
    "skip_checks",
}


def test_help_lists_every_option():
    result = run_command("--help")
    assert result.returncode == 0, result.stderr
    options = worker_options()
    assert set(options) >= {
        "--concurrency",
        "--queue",
        "--poll-interval",
        "--lease-ttl",
        "--heartbeat-interval",
        "--shutdown-timeout",
        "--burst",
        "--max-jobs",
        "--worker-id",
    }
    for option in options:
        assert option in result.stdout, f"{option} missing from --help"
    assert "SIGTERM" in result.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--concurrency", "0"], "must be positive"),
        (["--concurrency", "two"], "is not a number"),
        (["--lease-ttl", "-1"], "must be positive"),
        (["--shutdown-timeout", "-1"], "must not be negative"),
        (["--max-jobs", "0"], "must be positive"),
        (["--lease-ttl", "2", "--heartbeat-interval", "5"], "at most half the lease TTL"),
        (["--shutdown-timeout", "soon"], "is not a number"),
        (["--shutdown-timeout", "inf"], "must not be negative (and finite)"),
        (["--prefetch", "-1"], "must not be negative"),
        (["--prefetch", "lots"], "is not a whole number"),
        (["--worker-id", ""], "must be a non-empty string"),
        (["--worker-id", "w" * 256], "must be at most 255 characters"),
        (["--worker-id", "w\x1b[2J"], "must not contain control characters"),
        (["--worker-id", "w\rHealthy."], "must not contain control characters"),
        (["--poll-interval", "9.3e9"], "is over 1,000,000 seconds"),
        (["--lease-ttl", "1e12"], "is over 1,000,000 seconds"),
        (["--heartbeat-interval", "1e12"], "is over 1,000,000 seconds"),
        (["--shutdown-timeout", "1e12"], "is over 1,000,000 seconds"),
        (["--queue", "q\x07"], "queue must not contain control characters"),
        (["--queue", ""], "queue must be a non-empty string"),
        (["--queue", "q" * 101], "queue must be at most 100 characters"),
        (["--concurrency", "1" * 400], "must be positive and finite"),  # too large for a float
    ],
)
def test_bad_option_values_are_refused_before_the_worker_starts(args, message):
    result = run_command(*args)
    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.django_db(transaction=True)
def test_burst_exits_zero_when_nothing_is_runnable(start_worker):
    later = jobqueue.enqueue("test.noop", run_after=dt.timedelta(hours=1))
    upstream = jobqueue.enqueue("test.noop", run_after=dt.timedelta(hours=1))
    waiting = jobqueue.enqueue("test.noop", depends_on=[upstream])
    worker = start_worker("--burst")
    assert worker.wait(60) == 0
    for job in (later, upstream):
        assert Job.objects.get(pk=job.pk).state == Job.State.SCHEDULED
    assert Job.objects.get(pk=waiting.pk).state == Job.State.WAITING
    assert not Worker.objects.live().exists()
    assert_clean_log(worker.output())


@pytest.mark.django_db(transaction=True)
def test_burst_runs_everything_runnable_then_exits_zero(start_worker):
    jobs = [jobqueue.enqueue("test.add", {"a": i, "b": 1}) for i in range(6)]
    blocked = jobqueue.enqueue("test.upstream_sum", depends_on=jobs[:2])
    worker = start_worker("--burst", "--concurrency", "2")
    assert worker.wait(120) == 0
    assert [Job.objects.get(pk=j.pk).result for j in jobs] == [i + 1 for i in range(6)]
    # Released by its upstreams during the run, it ran in the same burst.
    done = Job.objects.get(pk=blocked.pk)
    assert done.state == Job.State.DONE
    assert done.result == 3
    assert_clean_log(worker.output())


@pytest.mark.django_db(transaction=True)
def test_max_jobs_exits_after_n_jobs(start_worker):
    jobs = [jobqueue.enqueue("test.add", {"a": i, "b": 0}) for i in range(5)]
    worker = start_worker("--max-jobs", "3", "--concurrency", "2")
    assert worker.wait(120) == 0
    states = [Job.objects.get(pk=j.pk).state for j in jobs]
    assert states.count(Job.State.DONE) == 3
    assert states.count(Job.State.READY) == 2
    assert Job.objects.filter(attempts__gt=0).count() == 3  # the others were never claimed
    assert "claimed 3 jobs" in worker.output()
    assert not Worker.objects.live().exists()


@pytest.mark.django_db(transaction=True)
def test_max_jobs_waits_for_work_before_exiting(start_worker):
    worker = start_worker("--max-jobs", "1")
    worker.wait_registered()
    assert worker.running()  # not a burst: it waits for its one job
    job = jobqueue.enqueue("test.add", {"a": 1, "b": 1})
    assert worker.wait(60) == 0
    assert Job.objects.get(pk=job.pk).state == Job.State.DONE


@pytest.mark.django_db(transaction=True)
def test_queue_option_limits_what_the_worker_claims(start_worker):
    mine = jobqueue.enqueue("test.add", {"a": 1, "b": 1}, queue="mine")
    theirs = jobqueue.enqueue("test.add", {"a": 2, "b": 2}, queue="theirs")
    default = jobqueue.enqueue("test.add", {"a": 3, "b": 3})
    worker = start_worker("--queue", "mine", "--burst")
    assert worker.wait(60) == 0
    assert wait_for_job(mine.pk, *TERMINAL).state == Job.State.DONE
    assert Job.objects.get(pk=theirs.pk).state == Job.State.READY
    assert Job.objects.get(pk=default.pk).state == Job.State.READY


@pytest.mark.django_db(transaction=True)
def test_workers_starting_together_on_deferred_sqlite_never_see_database_is_locked(
    start_worker,
) -> None:
    from django.db import connection

    if connection.vendor != "sqlite":
        pytest.skip("SQLite's DEFERRED transactions only")
    jobqueue.enqueue_many([("test.noop", {})] * 300)
    env = {"JOBQUEUE_TEST_SQLITE_DEFERRED": "1"}
    workers = [start_worker("--burst", "--poll-interval", "0.01", env=env) for _ in range(4)]
    for worker in workers:
        assert worker.wait(120) == 0, worker.output()
        # A heartbeat that gives up its lock wait to stay on time says so and loses nothing
        # (tests/conftest.py); any other "database is locked" is the failure.
        locked = [
            line
            for line in worker.output().splitlines()
            if "database is locked" in line and not line.startswith(SKIPPED_BEAT)
        ]
        assert not locked, worker.output()
    assert Job.objects.filter(state="done").count() == 300


@pytest.mark.django_db(transaction=True)
def test_reload_restarts_the_worker_when_code_changes(start_worker):
    """--reload: Django's autoreloader restarts the worker process when a module changes."""
    worker = start_worker("--reload", "--poll-interval", "0.05")
    first = poll(lambda: Worker.objects.order_by("started_at").first(), timeout=60)
    done = jobqueue.enqueue("test.add", {"a": 1, "b": 1})
    assert wait_for_job(done.pk, *TERMINAL).state == Job.State.DONE
    jobs_py = ROOT / "tests" / "testapp" / "jobs.py"
    stat = jobs_py.stat()
    touched = {"count": 0, "at": -10.0}

    def restarted() -> Worker | None:
        # The reloader compares each file's mtime with the one it saw on its previous tick
        # (once a second); a file it has not snapshotted yet is only recorded. One touch can
        # fall before that first snapshot on a loaded machine, so move the mtime forward
        # again every few seconds until a new worker process shows up.
        if time.monotonic() - touched["at"] > 3:
            touched["count"] += 1
            touched["at"] = time.monotonic()
            later = stat.st_mtime + 5 * touched["count"]
            os.utime(jobs_py, (later, later))
        return Worker.objects.exclude(pid=first.pid).first()

    try:
        second = poll(restarted, timeout=60, interval=0.5)
    finally:
        os.utime(jobs_py, (stat.st_atime, stat.st_mtime))
    assert second.pid != first.pid
    after = jobqueue.enqueue("test.add", {"a": 2, "b": 2})
    assert wait_for_job(after.pk, *TERMINAL).result == 4
    assert worker.output().count(" starting: ") >= 2
    worker.kill()
