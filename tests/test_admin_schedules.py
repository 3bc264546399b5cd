"""The admin's Schedules page: every schedule, when it runs, its next slots and its last
enqueued job, read-only and permission-checked."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.test import Client

import django_jobqueue as jobqueue
from django_jobqueue.models import ScheduleState
from tests.admin_support import login, make_user, url

pytestmark = pytest.mark.django_db

NOW = dt.datetime(2026, 1, 1, 10, 0, 5, tzinfo=dt.UTC)


@pytest.fixture(autouse=True)
def configured(settings: Any) -> None:
    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "SCHEDULE_CLOCK": lambda: NOW,
        "SCHEDULES": {
            "nightly-report": {
                "handler": "test.noop",
                "cron": "0 3 * * *",
                "timezone": "Europe/Paris",
                "group": "reports",
            },
            "poll-feeds": {"handler": "test.noop", "every": 30, "queue": "feeds"},
        },
    }


def test_the_page_lists_each_schedule_with_its_next_slots_and_last_job(
    admin_client: Client,
) -> None:
    job = jobqueue.enqueue("test.noop")
    ScheduleState.objects.create(
        name="poll-feeds",
        last_slot=NOW - dt.timedelta(seconds=5),
        enqueued_slot=NOW - dt.timedelta(seconds=5),
        job_id=job.pk,
    )
    response = admin_client.get(url("schedulestate_changelist"))
    assert response.status_code == 200
    html = response.content.decode()
    assert "nightly-report" in html and "cron &#x27;0 3 * * *&#x27; (Europe/Paris)" in html
    assert "2026-01-02T03:00:00+01:00" in html  # the next slot, in the schedule's zone
    assert "poll-feeds" in html and "every 30s" in html and "feeds" in html
    assert "2026-01-01T10:00:30+00:00" in html and "2026-01-01T10:01:30+00:00" in html
    assert f"job {job.pk}</a>" in html and url("job_change", job.pk) in html
    assert html.count(">never<") == 1  # nightly-report has enqueued nothing yet
    # Read-only: no add, and a state row's page leads back to the list.
    assert admin_client.get(url("schedulestate_add")).status_code == 403
    change = admin_client.get(url("schedulestate_change", "poll-feeds"))
    assert change.status_code == 302 and change["Location"] == url("schedulestate_changelist")


def test_a_bad_schedule_is_said_on_the_page(admin_client: Client, settings: Any) -> None:
    settings.JOBQUEUE = {
        **settings.JOBQUEUE, "SCHEDULES": {"bad": {"handler": "test.noop", "every": 0}}
    }  # fmt: skip
    html = admin_client.get(url("schedulestate_changelist")).content.decode()
    assert "errornote" in html and "every" in html


def test_the_page_is_permission_checked() -> None:
    page = url("schedulestate_changelist")
    assert login(make_user("jobs-only", "view_job")).get(page).status_code == 403
    viewer = login(make_user("viewer", "view_schedulestate"))
    assert "nightly-report" in viewer.get(page).content.decode()
