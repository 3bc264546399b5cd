"""The operators' cockpit (issue 51): a jobs list whose columns tell the truth and refresh
themselves, an overview whose charts fit their data, and workers that stay listed once gone."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.test import Client
from django.utils import timezone

from django_jobqueue import metrics
from django_jobqueue.admin.bulk import BULK_HANDLER
from django_jobqueue.models import Job, MinuteCount, MinuteSpend
from tests.support.admin_support import Scenario, error, url
from tests.support.factories import JobFactory

pytestmark = pytest.mark.django_db


def row(html: str, job: Job) -> str:
    """The list row of `job` in a changelist page."""
    return html.split(f'name="_selected_action" value="{job.pk}"')[1].split("</tr>")[0]


def test_a_done_jobs_earlier_error_is_marked_as_earlier(admin_client: Client) -> None:
    now = timezone.now()
    done = JobFactory(
        state=Job.State.DONE, attempts=2, started_at=now - dt.timedelta(seconds=75),
        finished_at=now, last_error=error(1), errors=[error(1)],
    )  # fmt: skip
    dead = JobFactory(state=Job.State.DEAD, attempts=3, finished_at=now, last_error=error(3))
    html = admin_client.get(url("job_changelist")).content.decode()
    assert (
        '<span class="jq-earlier">earlier attempt: RuntimeError: upstream API returned 502</span>'
        in row(html, done)
    )
    assert "earlier attempt" not in row(html, dead)
    assert "RuntimeError: upstream API returned 502" in row(html, dead)


def test_progress_shows_only_while_running_and_a_finished_job_says_what_it_took(
    admin_client: Client,
) -> None:
    now = timezone.now()
    progress = {"current": 40, "total": 40, "message": "", "updated_at": None}
    done = JobFactory(
        state=Job.State.DONE, attempts=1, progress=progress,
        started_at=now - dt.timedelta(seconds=125), finished_at=now,
    )  # fmt: skip
    retrying = JobFactory(state=Job.State.SCHEDULED, attempts=1, progress=progress)
    running = JobFactory(
        state=Job.State.RUNNING, attempts=1, progress=progress, lease_owner="w",
        lease_expires=now + dt.timedelta(seconds=30), started_at=now - dt.timedelta(seconds=3),
    )  # fmt: skip
    for page in ("job_changelist", "livelease_changelist"):
        html = admin_client.get(url(page)).content.decode()
        assert "<progress" in row(html, running), page
    html = admin_client.get(url("job_changelist")).content.decode()
    assert "<progress" not in row(html, done) and "<progress" not in row(html, retrying)
    assert "took 2m 05s" in row(html, done)
    assert "took" not in row(html, running) and "took" not in row(html, retrying)
    assert "<th" in html and "Run time" in html


def test_the_queues_own_handlers_are_not_offered_in_the_filters(admin_client: Client) -> None:
    JobFactory(type=BULK_HANDLER)
    response = admin_client.get(url("job_changelist"))
    html = response.content.decode()
    assert f"?type={BULK_HANDLER}" not in html and f"type={BULK_HANDLER}" not in html
    # Named in the URL, it still filters (an operator who knows it finds its jobs).
    response = admin_client.get(url("job_changelist") + f"?type={BULK_HANDLER}")
    assert response.status_code == 200 and len(response.context["cl"].result_list) == 1


def test_the_jobs_list_refreshes_itself(admin_client: Client) -> None:
    html = admin_client.get(url("job_changelist")).content.decode()
    assert 'data-jq-live="5" data-jq-live-target="changelist"' in html
    assert "django_jobqueue/live.js" in html


# -- overview ---------------------------------------------------------------------------------


def counts(minutes_ago: list[int], **values: int) -> None:
    """A worker's figures for the given minutes before now."""
    now = metrics.minute_of(timezone.now())
    for back in minutes_ago:
        MinuteCount.objects.create(
            minute=now - dt.timedelta(minutes=back), worker="w", latency=[], **values
        )


def charts_of(html: str) -> list[str]:
    return re.findall(r'<svg class="jq-chart".*?</svg>', html, re.S)


@pytest.mark.parametrize(
    ("minutes_ago", "window"), [([], "15m"), ([2, 9], "15m"), ([40], "1h"), ([300], "24h")]
)
def test_the_window_is_the_shortest_that_holds_the_figures(
    admin_client: Client, minutes_ago: list[int], window: str
) -> None:
    counts(minutes_ago, started=3, finished=3)
    response = admin_client.get(url("queueoverview_changelist"))
    assert response.context["window"].key == window
    labels = {"15m": "15 minutes", "1h": "hour", "24h": "24 hours"}
    html = response.content.decode()
    assert f"<strong>{labels[window]}</strong>" in html
    for other in set(labels) - {window}:
        assert f'href="?range={other}"' in html


def test_counts_are_bars_with_empty_minutes_as_zero_and_round_axes(admin_client: Client) -> None:
    counts([1, 7], started=12, finished=10, failed=2)
    html = admin_client.get(url("queueoverview_changelist") + "?range=15m").content.decode()
    jobs = charts_of(html)[0]
    bars = re.findall(r"<rect x=[^>]*><title>([^<]*)</title>", jobs)
    assert len(bars) == 6  # started, finished and failed in each of the two minutes
    assert any(title.endswith("started: 12") for title in bars), bars
    # The y axis counts in round steps from zero, past the tallest bar (12).
    ticks = re.findall(r'text-anchor="end">([\d,]+)</text>', jobs)
    assert ticks[0] == "0" and int(ticks[-1]) >= 12 and len(ticks) <= 6, ticks
    # The x axis has a tick every 5 minutes of the clock, and ends at now.
    times = re.findall(r'text-anchor="middle">(\d\d:\d\d)</text>', jobs)
    assert times and all(int(t[-2:]) % 5 == 0 for t in times), times
    assert ">now</text>" in jobs


def test_captions_describe_now(admin_client: Client) -> None:
    counts([3], started=4, finished=4)
    old = timezone.now() - dt.timedelta(seconds=90)
    JobFactory(queue="emails")
    Job.objects.filter(queue="emails").update(updated_at=old, created_at=old)
    html = admin_client.get(url("queueoverview_changelist")).content.decode()
    assert "last 15 minutes: 4 started, 4 finished, 0 failed" in html
    assert "now: 1 ready (emails 1)" in html
    assert re.search(r"now: waiting 1m \d\ds", html), html
    assert "latest:" not in html


def test_the_handler_table_sums_the_window(admin_client: Client) -> None:
    now = timezone.now()
    ago = lambda seconds: now - dt.timedelta(seconds=seconds)  # noqa: E731
    for run in (1, 2, 3, 4, 100):
        JobFactory(
            type="reports.build", state=Job.State.DONE, attempts=1, created_at=ago(300),
            first_started_at=ago(300 - 5), started_at=ago(run + 10), finished_at=ago(10),
        )  # fmt: skip
    JobFactory(
        type="reports.build", state=Job.State.DONE, attempts=2, started_at=ago(20),
        first_started_at=ago(60), finished_at=ago(15), last_error=error(1),
    )  # fmt: skip
    JobFactory(
        type="reports.fetch", state=Job.State.DEAD, attempts=3, started_at=ago(50),
        first_started_at=ago(200), finished_at=ago(40), last_error=error(3),
    )  # fmt: skip
    JobFactory(type="reports.old", state=Job.State.DONE, attempts=1, finished_at=ago(7200))
    MinuteSpend.objects.create(
        minute=metrics.minute_of(now), resource="tenant:42", handler="reports.build", units=7
    )
    response = admin_client.get(url("queueoverview_changelist") + "?range=1h")
    rows = {row["type"]: row for row in response.context["handlers"]}
    assert set(rows) == {"reports.build", "reports.fetch"}  # not the job of two hours ago
    build, fetch = rows["reports.build"], rows["reports.fetch"]
    assert (build["started"], build["done"], build["failed"], build["dead"]) == (6, 6, 1, 0)
    assert (build["p50_run"], build["p95_run"]) == ("3s", "1m 40s")
    assert build["units"] == [("tenant:42", 7)]
    assert (fetch["started"], fetch["done"], fetch["failed"], fetch["dead"]) == (1, 0, 3, 1)
    html = response.content.decode()
    assert 'id="jq-handlers"' in html and "tenant:42: 7" in html


def test_the_overview_leads_the_job_queue_section(admin_client: Client) -> None:
    html = admin_client.get("/admin/").content.decode()
    section = html.split("app-django_jobqueue")[1]
    first = re.search(r'<a href="(/admin/django_jobqueue/[a-z]+/)"', section)
    assert first and first.group(1) == url("queueoverview_changelist"), section[:400]


# -- workers ----------------------------------------------------------------------------------


def test_workers_show_their_start_uptime_and_jobs_done_and_refresh(
    admin_client: Client, scenario: Scenario
) -> None:
    minute = metrics.minute_of(timezone.now())
    for back, finished, failed in ((0, 30, 2), (1, 12, 0)):
        MinuteCount.objects.create(
            minute=minute - dt.timedelta(minutes=back), worker=scenario.live_worker.pk,
            started=finished + failed, finished=finished, failed=failed, latency=[],
        )  # fmt: skip
    MinuteCount.objects.create(minute=minute, worker="someone-else", finished=5, latency=[])
    html = admin_client.get(url("worker_changelist")).content.decode()
    live = html.split(scenario.live_worker.pk)[1].split("</tr>")[0]
    assert '42 done, <span class="jq-warn">2 failed</span>' in live
    assert "up 1h 00m" in live or "up 1h 01m" in live  # it started an hour before the scenario
    stale = html.split(scenario.stale_worker.pk)[1].split("</tr>")[0]
    assert "0 done, 0 failed" in stale and "up 2h 0" in stale
    assert 'data-jq-live="5" data-jq-live-target="changelist"' in html
    page = admin_client.get(url("worker_change", scenario.live_worker.pk)).content.decode()
    assert "42 done" in page
