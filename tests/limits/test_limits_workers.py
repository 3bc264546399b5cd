"""JOBQUEUE["LIMITS"] across three worker processes: exact under contention (measured from
the handlers' own start and end times, or the claims' for a rate), a cooldown
after RateLimited, and a live change followed within seconds."""

from __future__ import annotations

import json
import time
from io import StringIO

import pytest
from django.core.management import call_command

import django_jobqueue as jobqueue
from django_jobqueue.models import Job, Limit
from tests.conftest import assert_clean_log, poll
from tests.support.workflow_support import FAST, max_overlap, run_intervals
from tests.testapp.models import RunRecord

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

LIMITS = {
    "api": {"concurrency": 2},
    "tokens": {"rate": "100/s"},
    "tenant:*": {"concurrency": 1},
    "live": {"concurrency": 1},
}


@pytest.fixture(autouse=True)
def limits(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "LIMITS": LIMITS}


def fleet(start_worker, count: int = 3, concurrency: int = 4) -> list:
    env = {"JOBQUEUE_TEST_LIMITS": json.dumps(LIMITS)}
    return [start_worker("--concurrency", str(concurrency), *FAST, env=env) for _ in range(count)]


def drain(workers, jobs: list[Job], timeout: float = 150) -> None:
    ids = [j.pk for j in jobs]
    poll(
        lambda: Job.objects.filter(pk__in=ids, state=Job.State.DONE).count() == len(ids),
        timeout=timeout,
        interval=0.1,
    )
    for worker in workers:
        assert worker.stop() == 0, worker.output()
        assert_clean_log(worker.output())


def test_a_tenant_pattern_keeps_each_tenant_to_one_job_at_a_time(start_worker):
    jobs = [
        jobqueue.enqueue("limits.tenant_work", {"tenant": t, "sleep": 0.2})
        for _ in range(6)
        for t in (1, 2, 3)
    ]
    drain(fleet(start_worker), jobs)
    for tenant in (1, 2, 3):
        ids = [j.pk for j in jobs if j.args["tenant"] == tenant]
        assert max_overlap(run_intervals(pk__in=ids)) == 1, tenant
    assert max_overlap(run_intervals(pk__in=[j.pk for j in jobs])) >= 2  # tenants side by side


def test_a_job_meets_both_limits_it_uses(start_worker):
    both = [jobqueue.enqueue("limits.work", {"sleep": 0.2}, uses={"api": 1, "tenant:7": 1})
            for _ in range(5)]  # fmt: skip
    api = [jobqueue.enqueue("limits.work", {"sleep": 0.2}, uses={"api": 1}) for _ in range(10)]
    drain(fleet(start_worker), both + api)
    assert max_overlap(run_intervals(pk__in=[j.pk for j in both])) == 1  # tenant:7's cap
    overlap = max_overlap(run_intervals(pk__in=[j.pk for j in both + api]))
    assert overlap == 2, overlap  # api's cap, reached


def starts_per_window(jobs: list[Job], window: float = 1.0) -> list[int]:
    """For each job's start (its claim's `started_at`), the starts in the window it opens."""
    times = sorted(
        Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("started_at", flat=True)
    )
    return [sum(1 for t in times if start <= t < start + dt_seconds(window)) for start in times]


def dt_seconds(seconds: float):
    import datetime as dt

    return dt.timedelta(seconds=seconds)


def test_a_rate_with_costs_holds(start_worker):
    """100 tokens a second, 30 a job: at most 3 starts in any second. (How closely a fleet
    approaches a rate is a speed: bench/ measures it; a test only prints it.)"""
    jobs = [jobqueue.enqueue("limits.work", uses={"tokens": 30}) for _ in range(15)]
    drain(fleet(start_worker), jobs)
    counts = starts_per_window(jobs)
    print(f"starts per window: {counts}")
    assert max(counts) <= 3, counts


def test_rate_limited_closes_the_resource_for_its_retry_after(start_worker):
    raiser = jobqueue.enqueue(
        "limits.rate_limited_once", {"resource": "api", "retry_after": 2}, uses={"api": 1},
        max_attempts=1,
    )  # fmt: skip
    workers = fleet(start_worker)
    poll(lambda: RunRecord.objects.filter(job_id=raiser.pk, attempt=0).exists())
    closed_at = RunRecord.objects.get(job_id=raiser.pk, attempt=0).started
    poll(lambda: Limit.objects.filter(name="api", closed_until__isnull=False).exists())
    others = [jobqueue.enqueue("limits.work", uses={"api": 1}) for _ in range(4)]
    drain(workers, [raiser, *others])
    starts = RunRecord.objects.filter(job_id__in=[j.pk for j in others]).values_list(
        "started", flat=True
    )
    assert min(starts) >= closed_at + 2 - 0.05, min(starts) - closed_at
    done = Job.objects.get(pk=raiser.pk)
    assert (done.state, done.attempts, done.result) == ("done", 1, "after the cooldown")


def test_a_live_change_of_a_limit_is_followed_within_two_seconds(start_worker):
    jobs = [jobqueue.enqueue("limits.work", {"sleep": 0.3}, uses={"live": 1}) for _ in range(40)]
    workers = fleet(start_worker)
    poll(lambda: RunRecord.objects.filter(job_id__in=[j.pk for j in jobs]).count() >= 3)
    assert max_overlap(run_intervals(pk__in=[j.pk for j in jobs])) == 1
    call_command("jobqueue_limits", "set", "live", "--concurrency", "3", stdout=StringIO())
    changed = time.time()
    drain(workers, jobs)
    later = [
        (start, end)
        for start, end in run_intervals(pk__in=[j.pk for j in jobs])
        if start >= changed + 2.0
    ]
    assert later, "the jobs ran out before the change could show"
    overlap = max_overlap(later)
    assert 2 <= overlap <= 3, overlap


def test_a_reset_goes_back_to_the_settings_value_within_two_seconds(start_worker):
    call_command("jobqueue_limits", "set", "live", "--concurrency", "3", stdout=StringIO())
    jobs = [jobqueue.enqueue("limits.work", {"sleep": 0.3}, uses={"live": 1}) for _ in range(50)]
    ids = [j.pk for j in jobs]
    workers = fleet(start_worker)
    poll(lambda: max_overlap(run_intervals(pk__in=ids)) >= 2)  # the change is in force
    call_command("jobqueue_limits", "reset", "live", stdout=StringIO())
    reset = time.time()
    drain(workers, jobs)
    later = [(start, end) for start, end in run_intervals(pk__in=ids) if start >= reset + 2.0]
    assert later, "the jobs ran out before the reset could show"
    assert max_overlap(later) == 1  # LIMITS' own concurrency of 1 again
