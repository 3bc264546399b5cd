"""The operators' cockpit (issue 51): a jobs list whose columns tell the truth and refresh
themselves, an overview whose charts fit their data, and workers that stay listed once gone."""

from __future__ import annotations

import datetime as dt

import pytest
from django.test import Client
from django.utils import timezone

from django_jobqueue.admin.bulk import BULK_HANDLER
from django_jobqueue.models import Job
from tests.admin_support import error, url
from tests.factories import JobFactory

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
