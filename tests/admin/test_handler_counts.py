"""The overview's per-handler table from the workers' per-minute figures (`MinuteHandlerCount`):
what a worker tallies per handler key and writes, pruned with the other figures, and what the
table reads, from a real worker process on each database."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db.models import Sum
from django.test import Client
from django.utils import timezone

import django_jobqueue as jobqueue
from django_jobqueue import metrics
from django_jobqueue.admin.breakdown import handler_table
from django_jobqueue.lease_results import CLAIM_FIELDS, ClaimedJob
from django_jobqueue.models import Job, MinuteCount, MinuteHandlerCount
from tests.support.admin_support import url
from tests.support.factories import JobFactory

T0 = dt.datetime(2026, 12, 2, 10, 0, tzinfo=dt.UTC)


def claimed(handler: str) -> ClaimedJob:
    values = dict.fromkeys(CLAIM_FIELDS)
    values.update(type=handler, attempts=2, id=1, has_steps=False, created_at=T0)
    return ClaimedJob("default", [values[name] for name in CLAIM_FIELDS])


def test_the_tally_counts_per_handler_key():
    tally = metrics.Tally()
    now = T0 + dt.timedelta(seconds=5)
    tally.claimed([claimed("a"), claimed("a"), claimed("b")], now=now)
    tally.recorded(finished=1, handler="a", state="done", now=now)
    tally.recorded(finished=1, handler="a", state="cancelled", now=now)  # not a done job
    tally.recorded(failed=1, handler="b", state="scheduled", now=now)  # a retry follows
    tally.recorded(failed=1, handler="b", state="dead", now=now)
    tally.recorded(finished=1, now=now)  # no handler: the minute's totals only
    minute = tally.take(now)[T0]
    assert (minute["started"], minute["finished"], minute["failed"]) == (3, 3, 2)
    assert minute["handlers"] == {"a": [2, 1, 0, 0], "b": [1, 0, 2, 1]}
    taken = tally.take(now)
    assert taken == {}


@pytest.mark.django_db
def test_write_upserts_a_workers_handler_rows_and_sampling_prunes_them():
    lat = [0] * (len(metrics.LATENCY_BUCKETS) + 1)
    minute = {"started": 3, "finished": 2, "failed": 1, "latency": lat}
    metrics.write("default", "w1", {T0: {**minute, "handlers": {"a": [3, 2, 1, 0]}}})
    # The totals so far replace the row; a new handler key gets its own.
    handlers = {"a": [4, 3, 1, 0], "b": [1, 0, 1, 1]}
    metrics.write("default", "w1", {T0: {**minute, "handlers": handlers}})
    rows = MinuteHandlerCount.objects.order_by("handler")
    got = list(rows.values_list("handler", "started", "done", "failed", "dead"))
    assert got == [("a", 4, 3, 1, 0), ("b", 1, 0, 1, 1)]
    assert MinuteCount.objects.count() == 1
    now = timezone.now()
    old = metrics.minute_of(now) - metrics.KEEP - dt.timedelta(minutes=5)
    MinuteHandlerCount.objects.create(minute=old, worker="gone", handler="a", started=1)
    kept = metrics.minute_of(now) - dt.timedelta(hours=30)
    MinuteHandlerCount.objects.create(minute=kept, worker="w", handler="a", started=1)
    metrics.sample("default", now)
    assert not MinuteHandlerCount.objects.filter(worker="gone").exists()
    assert MinuteHandlerCount.objects.filter(worker="w").exists()


@pytest.mark.django_db
def test_the_table_counts_from_the_figures_and_the_jobs_only_before_them():
    """From the first minute a worker recorded, the figures count; the jobs table counts the
    part of the window before it (a queue run by `run_jobs()`, or older workers), and the
    cancelled jobs throughout."""
    now = timezone.now()
    ago = lambda minutes: now - dt.timedelta(minutes=minutes)  # noqa: E731
    first = metrics.minute_of(ago(10))
    for back in range(10):
        MinuteHandlerCount.objects.create(
            minute=first + dt.timedelta(minutes=back), worker="w", handler="reports.build",
            started=3, done=2, failed=1, dead=0,
        )  # fmt: skip
    MinuteHandlerCount.objects.create(
        minute=first, worker="w2", handler="reports.fetch", started=1, failed=1, dead=1
    )
    # Before the figures: counted from the jobs.
    JobFactory(
        type="reports.build", state=Job.State.DONE, attempts=2, started_at=ago(31),
        first_started_at=ago(32), finished_at=ago(30),
    )  # fmt: skip
    # After them: counted by the figures only (a worker recorded it, or run_jobs() ran it).
    JobFactory(
        type="reports.build", state=Job.State.DONE, attempts=1, started_at=ago(3),
        first_started_at=ago(3), finished_at=ago(2),
    )  # fmt: skip
    JobFactory(type="reports.build", state=Job.State.CANCELLED, finished_at=ago(1))
    JobFactory(type="reports.old", state=Job.State.CANCELLED, finished_at=ago(120))
    rows = {r["type"]: r for r in handler_table("default", now, now - dt.timedelta(hours=1))}
    assert set(rows) == {"reports.build", "reports.fetch"}
    build, fetch = rows["reports.build"], rows["reports.fetch"]
    got = (build["started"], build["done"], build["failed"], build["dead"], build["cancelled"])
    assert got == (30 + 1, 20 + 1, 10 + 1, 0, 1)
    assert (fetch["started"], fetch["done"], fetch["failed"], fetch["dead"]) == (1, 0, 1, 1)
    assert build["p50_run"] == "1m 00s"  # run times: the jobs that finished in the window
    # The 15-minute window starts after the job of 30 minutes ago.
    rows = {r["type"]: r for r in handler_table("default", now, now - dt.timedelta(minutes=15))}
    assert (rows["reports.build"]["started"], rows["reports.build"]["done"]) == (30, 20)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_workers_figures_fill_the_handler_table(start_worker, admin_client: Client):
    for n in range(6):
        jobqueue.enqueue("test.record", {"value": n})
    jobqueue.enqueue("test.fail", max_attempts=1)
    cancelled = jobqueue.enqueue(
        "test.record", {"value": 99}, run_after=timezone.now() + dt.timedelta(hours=1)
    )
    assert jobqueue.cancel(cancelled)
    worker = start_worker("--burst", "--concurrency", "2")
    assert worker.wait() == 0
    written = {
        handler: (started, done, failed, dead)
        for handler, started, done, failed, dead in MinuteHandlerCount.objects.values_list(
            "handler"
        ).annotate(*(Sum(name) for name in metrics.HANDLER_COUNTS))
    }
    assert written == {"test.record": (6, 6, 0, 0), "test.fail": (1, 0, 1, 1)}
    # Read from the figures, not the jobs: gone from the table, the jobs are still counted
    # (but their run times, measured on the jobs, are not).
    Job.objects.filter(state__in=[Job.State.DONE, Job.State.DEAD]).delete()
    response = admin_client.get(url("queueoverview_changelist") + "?range=1h")
    rows = {row["type"]: row for row in response.context["handlers"]}
    record, fail = rows["test.record"], rows["test.fail"]
    got = (record["started"], record["done"], record["failed"], record["dead"])
    assert got == (6, 6, 0, 0) and record["cancelled"] == 1
    assert (fail["started"], fail["done"], fail["failed"], fail["dead"]) == (1, 0, 1, 1)
    assert record["p50_run"] == "-"
