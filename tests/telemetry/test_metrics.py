"""The per-minute figures behind the overview's charts: what a worker tallies and writes, the
backlog samples, the series the charts read, and the charts themselves."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.test import Client
from django.utils import timezone

import django_jobqueue as jobqueue
from django_jobqueue import metrics
from django_jobqueue.lease_results import CLAIM_FIELDS, ClaimedJob
from django_jobqueue.models import Job, MinuteCount, MinuteSample
from tests.support.admin_support import url

T0 = dt.datetime(2026, 12, 2, 10, 0, tzinfo=dt.UTC)


def claimed(
    attempts: int,
    created: dt.datetime,
    run_after: dt.datetime | None = None,
    has_steps: bool = False,
):
    values = dict.fromkeys(CLAIM_FIELDS)
    values.update(
        attempts=attempts, created_at=created, run_after=run_after, id=1, has_steps=has_steps
    )
    return ClaimedJob("default", [values[name] for name in CLAIM_FIELDS])


def test_tally_counts_claims_outcomes_and_first_attempt_latency():
    tally = metrics.Tally()
    now = T0 + dt.timedelta(seconds=30)
    tally.claimed(
        [
            claimed(1, now - dt.timedelta(seconds=0.03)),  # 30 ms: the 0.05 bucket
            claimed(1, now - dt.timedelta(hours=1), run_after=now - dt.timedelta(seconds=2)),
            claimed(2, now - dt.timedelta(hours=5)),  # a retry: no latency
            claimed(1, now - dt.timedelta(hours=5), has_steps=True),  # resumed: no latency
        ],
        now=now,
    )
    tally.recorded(finished=2, failed=1, now=now)
    taken = tally.take(now)
    assert list(taken) == [T0]
    minute = taken[T0]
    assert (minute["started"], minute["finished"], minute["failed"]) == (4, 2, 1)
    latency = minute["latency"]
    assert sum(latency) == 2
    assert latency[metrics.LATENCY_BUCKETS.index(0.05)] == 1
    assert latency[metrics.LATENCY_BUCKETS.index(2.5)] == 1  # from run_after, not created_at
    # Nothing new: nothing to write; a later minute is its own row, the old one forgotten.
    assert tally.take(now) == {}
    later = T0 + dt.timedelta(minutes=3)
    tally.recorded(finished=1, now=later)
    assert list(tally.take(later)) == [T0 + dt.timedelta(minutes=3)]
    tally.recorded(finished=1, now=later)
    assert tally.take(later)[T0 + dt.timedelta(minutes=3)]["finished"] == 2  # totals so far


def test_minutes_not_written_are_taken_again():
    """The recorder hands back what it could not write: the next take has those minutes, with
    their totals by then; a minute old enough to be forgotten is not brought back."""
    tally = metrics.Tally()
    now = T0 + dt.timedelta(seconds=10)
    tally.recorded(finished=3, now=now)
    taken = tally.take(now)
    assert tally.take(now) == {}
    tally.untake(taken)
    tally.recorded(finished=1, now=now)
    assert tally.take(now)[T0]["finished"] == 4
    later = T0 + dt.timedelta(minutes=5)
    tally.recorded(finished=1, now=later)
    tally.take(later)  # forgets T0
    tally.untake(taken)
    assert tally.take(later) == {}


def test_quantile_reads_the_bucket_bounds():
    buckets = [0] * (len(metrics.LATENCY_BUCKETS) + 1)
    assert metrics.quantile(buckets, 0.5) is None
    buckets[0] = 90  # <= 10 ms
    buckets[6] = 10  # <= 2.5 s
    assert metrics.quantile(buckets, 0.5) == 0.01
    assert metrics.quantile(buckets, 0.95) == 2.5
    buckets[-1] = 1000  # beyond the last bound
    assert metrics.quantile(buckets, 0.95) == metrics.LATENCY_BUCKETS[-1]


@pytest.mark.django_db
def test_write_upserts_a_workers_minute_and_series_sums_the_workers():
    lat = [0] * (len(metrics.LATENCY_BUCKETS) + 1)
    metrics.write("default", "w1", {T0: {"started": 5, "finished": 4, "failed": 1, "latency": lat}})
    # The same minute again: the totals so far replace the row, never add a second one.
    lat2 = list(lat)
    lat2[2] = 7
    metrics.write(
        "default", "w1", {T0: {"started": 9, "finished": 8, "failed": 1, "latency": lat2}}
    )
    metrics.write(
        "default",
        "w2",
        {T0 + dt.timedelta(minutes=2): {"started": 3, "finished": 3, "failed": 0, "latency": lat}},
    )
    assert MinuteCount.objects.count() == 2
    row = MinuteCount.objects.get(worker="w1")
    assert (row.started, row.finished, row.latency[2]) == (9, 8, 7)

    data = metrics.series("default", T0, T0 + dt.timedelta(minutes=3))
    assert data["minutes"][0] == T0 and len(data["minutes"]) == 4
    assert data["finished"] == [8, None, 3, None]
    assert data["started"] == [9, None, 3, None]
    assert data["p50"][0] == metrics.LATENCY_BUCKETS[2]
    # Ten-minute steps sum the minutes of a step.
    assert metrics.series("default", T0, T0 + dt.timedelta(minutes=9), 10)["finished"] == [11]


@pytest.mark.django_db
def test_sample_takes_each_minute_once_and_a_drained_queue_reads_zero():
    now = timezone.now()
    for _ in range(3):
        jobqueue.enqueue("test.noop", queue="default")
    jobqueue.enqueue("test.noop", queue="emails")
    Job.objects.update(updated_at=now - dt.timedelta(seconds=90))
    assert metrics.sample("default", now) is True
    assert metrics.sample("default", now) is False  # another worker took this minute already
    rows = dict(MinuteSample.objects.values_list("queue", "ready"))
    assert rows == {"default": 3, "emails": 1}
    oldest = MinuteSample.objects.get(queue="default").oldest_ready
    assert 85 <= oldest <= 95

    Job.objects.filter(queue="emails").delete()
    later = now + dt.timedelta(minutes=1)
    assert metrics.sample("default", later) is True
    data = metrics.series("default", now - dt.timedelta(minutes=1), later)
    assert data["ready"]["default"][-2:] == [3, 3]
    assert data["ready"]["emails"][-2:] == [1, 0]  # sampled, and none was ready
    assert data["ready"]["default"][0] is None  # not sampled: a gap, not a zero


@pytest.mark.django_db
def test_sampling_drops_figures_older_than_two_days():
    now = timezone.now()
    old = metrics.minute_of(now) - metrics.KEEP - dt.timedelta(minutes=5)
    MinuteSample.objects.create(minute=old, queue="default", ready=1)
    MinuteCount.objects.create(minute=old, worker="gone")
    kept = metrics.minute_of(now) - dt.timedelta(hours=30)
    MinuteCount.objects.create(minute=kept, worker="w")
    metrics.sample("default", now)
    assert not MinuteSample.objects.filter(minute=old).exists()
    assert list(MinuteCount.objects.values_list("worker", flat=True)) == ["w"]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_records_what_it_did(start_worker):
    for n in range(20):
        jobqueue.enqueue("test.record", {"value": n})
    jobqueue.enqueue("test.fail", max_attempts=1)
    worker = start_worker("--burst", "--concurrency", "2")
    assert worker.wait() == 0
    totals = {
        name: sum(MinuteCount.objects.values_list(name, flat=True))
        for name in ("started", "finished", "failed")
    }
    assert totals == {"started": 21, "finished": 20, "failed": 1}
    buckets = [sum(b) for b in MinuteCount.objects.values_list("latency", flat=True)]
    assert sum(buckets) == 21  # every claim was a first attempt
    assert MinuteSample.objects.exists()


@pytest.mark.django_db
def test_overview_draws_the_charts_from_the_figures(admin_client: Client):
    now = timezone.now()
    lat = [0] * (len(metrics.LATENCY_BUCKETS) + 1)
    lat[3] = 10
    for back in range(5):
        minute = metrics.minute_of(now) - dt.timedelta(minutes=back)
        MinuteCount.objects.create(
            minute=minute, worker="w", started=10 + back, finished=9, failed=1, latency=lat
        )
        MinuteSample.objects.create(
            minute=minute, queue="default", ready=100 - back, oldest_ready=3
        )
    html = admin_client.get(url("queueoverview_changelist")).content.decode()
    charts = re.findall(r'<svg class="jq-chart".*?</svg>', html, re.S)
    assert len(charts) == 4
    assert "<rect" in charts[0] and "<rect" in charts[1], charts  # counts: bars
    assert "<polyline" in charts[2] and "<polyline" in charts[3], charts
    assert "Jobs per minute" in html and "Ready backlog by queue" in html
    assert "last 15 minutes: 60 started, 45 finished, 5 failed" in html
    day = admin_client.get(url("queueoverview_changelist") + "?range=day").content.decode()
    assert "Jobs per 10 minutes" in day


@pytest.mark.django_db
def test_overview_without_figures_says_so(admin_client: Client):
    html = admin_client.get(url("queueoverview_changelist")).content.decode()
    assert html.count("No figures recorded in this range yet.") == 4


def test_a_claimed_jobs_model_has_each_value_in_its_field():
    due = T0 + dt.timedelta(minutes=1)
    values = dict.fromkeys(CLAIM_FIELDS)
    values.update(id=7, type="t", timeout=0.3, created_at=T0, run_after=due, parent_id=3)
    job = ClaimedJob("default", [values[name] for name in CLAIM_FIELDS]).model()
    assert (job.pk, job.timeout, job.created_at, job.run_after, job.parent_id) == (
        7, 0.3, T0, due, 3
    )  # fmt: skip


# -- live pages -------------------------------------------------------------------------------

LIVE = re.compile(r'data-jq-live="(\d+)"')
SCRIPT = "django_jobqueue/live.js"


@pytest.mark.django_db
def test_live_pages_carry_the_refresh_marker_and_script(admin_client: Client, scenario):
    pages = {
        "overview": url("queueoverview_changelist"),
        "live leases": url("livelease_changelist"),
        "running job": url("job_change", scenario.running.pk),
    }
    for name, page in pages.items():
        html = admin_client.get(page).content.decode()
        assert LIVE.search(html), name
        assert SCRIPT in html, name
    # A finished job's page does not change: no refresh.
    done = admin_client.get(url("job_change", scenario.done.pk)).content.decode()
    assert not LIVE.search(done) and SCRIPT not in done
    # The list's refresh replaces its changelist region (the script holds while a row is ticked).
    leases = admin_client.get(pages["live leases"]).content.decode()
    assert 'data-jq-live-target="changelist"' in leases


@pytest.mark.django_db
def test_steps_start_on_the_hours_multiples_and_lose_no_minute():
    lat = [0] * (len(metrics.LATENCY_BUCKETS) + 1)
    for minute in range(3, 25):  # 10:03 to 10:24, one finished job each
        metrics.write(
            "default",
            "w",
            {T0 + dt.timedelta(minutes=minute): {"finished": 1, "latency": lat}},
        )
    data = metrics.series(
        "default", T0 + dt.timedelta(minutes=3), T0 + dt.timedelta(minutes=29), 10
    )
    assert data["minutes"] == [T0 + dt.timedelta(minutes=m) for m in (0, 10, 20)]
    assert data["finished"] == [7, 10, 5]
