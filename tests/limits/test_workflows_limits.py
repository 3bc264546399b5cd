"""Global concurrency limits: GROUP_LIMITS, QUEUE_LIMITS and the DYNAMIC_LIMIT hook hold across
worker processes (the handler intervals of test runs never overlap more than the cap)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.db import transaction

import django_jobqueue as jobqueue
from django_jobqueue.models import Job
from tests.conftest import assert_clean_log, poll
from tests.support.workflow_support import FAST, limits_env, max_overlap, run_burst, run_intervals

pytestmark = pytest.mark.django_db(transaction=True)


def work(group: str, count: int, sleep: float, queue: str | None = None) -> list[Job]:
    spec = {"type": "wf.step", "args": {"sleep": sleep}, "group": group}
    return jobqueue.enqueue_many([{**spec, "queue": queue} if queue else spec] * count)


def run_fleet(
    start_worker, env, jobs: Callable[[], object], *, workers: int, concurrency: int, total: int
) -> None:
    """Start `workers` processes, enqueue with `jobs()` in one commit once they all claim,
    wait until `total` jobs are done, and stop them cleanly. (Enqueued before, the jobs could
    all be run by the first process up: a start takes seconds on a loaded machine.)"""
    fleet = [
        start_worker("--concurrency", str(concurrency), *FAST, env=env) for _ in range(workers)
    ]
    for worker in fleet:
        worker.wait_registered()
    with transaction.atomic():
        jobs()

    def done() -> bool:
        return Job.objects.filter(state=Job.State.DONE).count() == total

    poll(done, timeout=150, interval=0.1)
    for worker in fleet:
        assert worker.stop() == 0, worker.output()
        assert_clean_log(worker.output())
    assert Job.objects.count() == total


@pytest.mark.slow
def test_group_limit_holds_across_three_workers_of_concurrency_eight(start_worker):
    """GROUP_LIMITS {"openai": 4}: 24 slots across 3 processes, 60 "openai" jobs of ~0.2s, and
    never more than 4 of them run at once; another group's jobs are not held to that cap."""

    def jobs() -> None:
        work("openai", 60, 0.2)
        work("other", 40, 0.3)

    env = limits_env(group_limits={"openai": 4})
    run_fleet(start_worker, env, jobs, workers=3, concurrency=8, total=100)

    openai = max_overlap(run_intervals(group_key="openai"))
    print(f"most openai jobs running at once: {openai}")
    assert 2 <= openai <= 4, openai  # concurrency happened, the cap held
    assert max_overlap(run_intervals(group_key="other")) > 4


@pytest.mark.slow
def test_queue_limit_holds_across_workers_and_groups(start_worker):
    """QUEUE_LIMITS {"narrow": 3}: jobs of three groups in queue "narrow" never run more than
    3 at once, across 3 processes of concurrency 4; the default queue is not held to it."""

    def jobs() -> None:
        for group in ("g1", "g2", "g3"):
            work(group, 12, 0.15, queue="narrow")
        work("g1", 24, 0.15)

    env = limits_env(queue_limits={"narrow": 3})
    run_fleet(start_worker, env, jobs, workers=3, concurrency=4, total=60)

    narrow = max_overlap(run_intervals(queue="narrow"))
    print(f"most narrow-queue jobs running at once: {narrow}")
    assert 2 <= narrow <= 3, narrow
    assert max_overlap(run_intervals(queue="default")) > 3


@pytest.mark.slow
def test_dynamic_limit_holds_across_worker_processes(start_worker):
    """DYNAMIC_LIMIT as a dotted path, answering 1 for group "dyn": across 3 processes of
    concurrency 4, its jobs run one at a time."""

    def jobs() -> None:
        work("dyn", 12, 0.1)
        work("free", 12, 0.1)

    env = {"JOBQUEUE_TEST_DYNAMIC_LIMIT": "tests.testapp.workflow_jobs.dynamic_limit"}
    run_fleet(start_worker, env, jobs, workers=3, concurrency=4, total=24)
    assert max_overlap(run_intervals(group_key="dyn")) == 1
    assert max_overlap(run_intervals(group_key="free")) > 1


def test_dynamic_limit_callable_and_the_smallest_cap_wins(settings):
    """A DYNAMIC_LIMIT callable caps a group like GROUP_LIMITS does; with both, the smaller
    cap holds: "dyn" min(5, 1) = 1, "capped" min(2, 3) = 2; "free" has no cap."""
    asked: set[str] = set()

    def hook(group: str) -> int | None:
        asked.add(group)
        return {"dyn": 1, "capped": 3}.get(group)

    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "DYNAMIC_LIMIT": hook,
        "GROUP_LIMITS": {"dyn": 5, "capped": 2},
    }
    for group in ("dyn", "capped", "free"):
        work(group, 6, 0.15)
    assert run_burst(concurrency=4) == 0
    assert set(Job.objects.values_list("state", flat=True)) == {"done"}
    assert max_overlap(run_intervals(group_key="dyn")) == 1
    assert max_overlap(run_intervals(group_key="capped")) <= 2
    assert max_overlap(run_intervals(group_key="free")) >= 2
    assert {"dyn", "capped", "free"} <= asked
