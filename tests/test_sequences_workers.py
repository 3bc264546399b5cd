"""Sequences with real worker processes: a sequence's jobs run one at a time in enqueue order
under three workers, through retries and durable sleeps; a dead job continues or blocks."""

from __future__ import annotations

from pathlib import Path

import pytest

import django_jobqueue as jobqueue
from django_jobqueue.models import Job
from tests.conftest import poll, wait_for_job
from tests.workflow_support import FAST

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
