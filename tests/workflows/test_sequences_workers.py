"""Sequences with real worker processes: a sequence's jobs run one at a time in enqueue order
under three workers, through retries, durable sleeps and a SIGKILLed worker; a dead job
continues or blocks; producer processes enqueuing into one sequence at once give it the order
of their commits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import django_jobqueue as jobqueue
from django_jobqueue.models import Job
from tests.conftest import ROOT, poll, wait_for_job
from tests.support.workflow_support import FAST
from tests.testapp.models import Order

SHORT_LEASE = ("--lease-ttl", "2", "--heartbeat-interval", "0.5", *FAST)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def runs(marker: Path) -> list[tuple[str, int]]:
    """The (event, n) of each "start <n>" / "end <n>" line, in the order written."""
    if not marker.exists():
        return []
    return [(e, int(n)) for e, n, *_ in (line.split() for line in marker.read_text().splitlines())]


def assert_one_at_a_time_in_order(marker: Path, expected: list[int]) -> None:
    """Each run ended before the next started, and the jobs first started in `expected` order."""
    events = runs(marker)
    running = None
    first_starts: list[int] = []
    for event, n in events:
        if event == "start":
            assert running is None, f"job {n} started while job {running} ran: {events}"
            running = n
            if n not in first_starts:
                first_starts.append(n)
        else:
            assert running == n, events
            running = None
    assert first_starts == expected


def test_fifty_jobs_with_retries_and_sleeps_run_in_order_one_at_a_time(start_worker, tmp_path):
    marker = tmp_path / "runs"
    jobs = [
        jobqueue.enqueue(
            "seq.step",
            {
                "n": n,
                "marker": str(marker),
                "fail_once": n % 10 == 3,
                "sleep": 0.5 if n % 10 == 6 else 0.0,
                "work": 0.02,
            },
            sequence="account:42",
            # Other jobs of other sequences and of none compete for the same workers.
            priority=n % 3,
        )
        for n in range(1, 51)
    ]
    others = [jobqueue.enqueue("test.noop", priority=5) for _ in range(20)]
    for _ in range(3):
        start_worker("--concurrency", "4", *FAST)
    for job in jobs:
        done = wait_for_job(job.pk, *Job.TERMINAL_STATES, timeout=180)
        assert done.state == Job.State.DONE, done.last_error
    assert all(wait_for_job(o.pk, Job.State.DONE).state == "done" for o in others)
    assert_one_at_a_time_in_order(marker, list(range(1, 51)))
    retried = Job.objects.filter(pk__in=[j.pk for j in jobs], attempts=2).count()
    assert retried == 5


@pytest.mark.parametrize("on_failure", ["continue", "block"])
def test_a_dead_job_continues_or_blocks_its_sequence(start_worker, tmp_path, on_failure):
    marker = tmp_path / "runs"
    jobs = [
        jobqueue.enqueue(
            "seq.step",
            {"n": n, "marker": str(marker), "fail_always": n == 3, "work": 0.02},
            sequence="tenant:7",
            sequence_on_failure=on_failure,
            max_attempts=1,
        )
        for n in range(1, 8)
    ]
    start_worker("--concurrency", "4", *FAST)
    start_worker("--concurrency", "4", *FAST)
    assert wait_for_job(jobs[2].pk, *Job.TERMINAL_STATES, timeout=90).state == "dead"
    if on_failure == "continue":
        for job in jobs[3:]:
            assert wait_for_job(job.pk, *Job.TERMINAL_STATES, timeout=90).state == "done"
        assert_one_at_a_time_in_order(marker, list(range(1, 8)))
        return
    # Blocked: nothing after the dead head starts, until an operator acts.
    poll(lambda: ("end", 3) in runs(marker), timeout=60)
    later = Job.objects.filter(pk__in=[j.pk for j in jobs[3:]])
    assert set(later.values_list("state", flat=True)) == {"waiting"}
    assert ("start", 4) not in runs(marker)
    assert jobqueue.cancel(jobs[2]) is True  # skip it: the rest goes on
    for job in jobs[3:]:
        assert wait_for_job(job.pk, *Job.TERMINAL_STATES, timeout=90).state == "done"
    assert_one_at_a_time_in_order(marker, list(range(1, 8)))


def test_a_head_whose_worker_is_killed_runs_again_before_any_later_job(start_worker, tmp_path):
    marker = tmp_path / "runs"
    jobs = [
        jobqueue.enqueue(
            "seq.step",
            {"n": n, "marker": str(marker), "work": 0.02, "hang_once": 60.0 if n == 1 else 0.0},
            sequence="ledger:1",
            max_attempts=3,
        )
        for n in range(1, 11)
    ]
    workers = [start_worker("--concurrency", "4", *SHORT_LEASE) for _ in range(2)]
    poll(lambda: ("start", 1) in runs(marker), timeout=60)
    pid = int(marker.read_text().split()[2])
    (doomed,) = [worker for worker in workers if worker.pid == pid]
    time.sleep(1)  # the others poll meanwhile: nothing of the sequence may start
    assert runs(marker) == [("start", 1)]
    doomed.kill()  # SIGKILL in the middle of the head's run
    start_worker("--concurrency", "4", *SHORT_LEASE)
    for job in jobs:
        done = wait_for_job(job.pk, *Job.TERMINAL_STATES, timeout=120)
        assert done.state == Job.State.DONE, done.last_error
    assert Job.objects.get(pk=jobs[0].pk).attempts == 2
    # The killed run left a start without an end; the head's second run ended before any
    # later job of the sequence started, and the rest ran one at a time in order.
    events = runs(marker)
    assert events[:3] == [("start", 1), ("start", 1), ("end", 1)], events
    marker.write_text("".join(f"{e} {n}\n" for e, n in events[1:]))
    assert_one_at_a_time_in_order(marker, list(range(1, 11)))


def test_producers_enqueuing_into_one_sequence_at_once_give_it_their_commit_order(
    start_worker, tmp_path
):
    """Four processes enqueue 25 jobs each into one sequence, interleaved, two of them one job
    per transaction and two five through enqueue_many, while three workers drain it (so
    its row is deleted and made again as it runs empty): no enqueue fails, and the jobs run
    once each, one at a time, in the order their transactions committed."""
    marker = tmp_path / "runs"
    workers = [start_worker("--concurrency", "4", *FAST) for _ in range(3)]
    for worker in workers:
        worker.wait_registered()
    env = {**os.environ, "JOBQUEUE_TEST_SUBPROCESS": "1"}
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    start_at = str(time.time() + 3)  # once every interpreter has started
    procs = []
    for p in range(4):
        mode = "single" if p < 2 else "many"
        command = [
            "tests.support.sequence_producer",
            "tenant:9",
            str(marker),
            str(p),
            "25",
            mode,
            start_at,
        ]
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
        procs.append(subprocess.Popen([sys.executable, "-m", *command], cwd=ROOT, env=env, **pipes))
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert json.loads(out)["failures"] == []
    committed = [
        int(n) for number in Order.objects.order_by("pk").values_list("number", flat=True)
        for n in number.split(",")
    ]  # fmt: skip
    assert sorted(committed) == sorted(p * 1000 + i for p in range(4) for i in range(25))
    jobs = Job.objects.filter(sequence="tenant:9")
    poll(lambda: set(jobs.values_list("state", flat=True)) == {Job.State.DONE}, timeout=180)
    assert [j.args["n"] for j in jobs.order_by("pk")] == committed
    events = runs(marker)
    assert sorted(n for e, n in events if e == "start") == sorted(committed)  # each once
    assert_one_at_a_time_in_order(marker, committed)
