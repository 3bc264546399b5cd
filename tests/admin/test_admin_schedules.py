"""The admin's Schedules page: every schedule, when it runs, its next slots and its last
enqueued job, read-only and permission-checked."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

import django_jobqueue as jobqueue
from django_jobqueue import schedule_rows, schedules
from django_jobqueue.models import Job, ScheduleDefinition, ScheduleState
from tests.support.admin_support import login, make_user, url

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


# -- stored schedules, pause, run now ------------------------------------------------------

POLL_FORM = {
    "name": "rows-poll",
    "handler": "test.add",
    "every": "30",
    "args": '{"a": 1, "b": 2}',
    "catch_up": "once",
    "grace": "60",
    "priority": "0",
    "group": "",
    "sequence_on_failure": "",
}


def test_a_stored_schedule_is_added_changed_and_deleted_through_its_forms(
    admin_client: Client,
) -> None:
    page = url("schedulestate_changelist")
    assert url("scheduledefinition_add") in admin_client.get(page).content.decode()
    # Not listed on its own in the admin's index: the Schedules page lists it.
    index = admin_client.get(reverse("admin:index")).content.decode()
    assert url("scheduledefinition_changelist") not in index
    assert admin_client.get(url("scheduledefinition_changelist"))["Location"] == page

    response = admin_client.post(url("scheduledefinition_add"), POLL_FORM)
    assert response.status_code == 302 and response["Location"] == page
    assert ScheduleState.objects.get(name="rows-poll").last_slot == NOW
    html = admin_client.get(page).content.decode()
    assert "rows-poll" in html and "stored" in html
    assert url("scheduledefinition_change", "rows-poll") in html  # its edit link
    assert '2026-01-01T10:00:30+00:00</time> <span class="jq-rel">in 25 s</span>' in html

    # Checked as a settings entry is: the form says why, and nothing changes.
    bad = {**POLL_FORM, "name": "bad", "every": "", "cron": "61 * * * *"}
    response = admin_client.post(url("scheduledefinition_add"), bad)
    assert response.status_code == 200
    assert "is not a valid cron expression" in response.content.decode()
    clash = {**POLL_FORM, "name": "poll-feeds"}
    response = admin_client.post(url("scheduledefinition_add"), clash)
    assert "taken by a schedule of JOBQUEUE" in response.content.decode()
    assert list(ScheduleDefinition.objects.values_list("name", flat=True)) == ["rows-poll"]

    change = url("scheduledefinition_change", "rows-poll")
    edited = {k: v for k, v in POLL_FORM.items() if k != "name"} | {"every": "60"}
    assert admin_client.post(change, edited)["Location"] == page
    assert ScheduleDefinition.objects.get(name="rows-poll").every == 60
    assert admin_client.post(change, {**edited, "every": "0"}).status_code == 200  # refused
    assert ScheduleDefinition.objects.get(name="rows-poll").every == 60

    # The keys left empty are not given, as in a settings entry (args: {}).
    bare = {"name": "bare", "handler": "test.noop", "cron": "*/5 * * * *", "catch_up": "skip"}
    bare |= {"grace": "10", "priority": "0"}
    assert admin_client.post(url("scheduledefinition_add"), bare)["Location"] == page
    assert schedule_rows.find("bare") == schedules.parse(
        "bare", {"handler": "test.noop", "cron": "*/5 * * * *", "catch_up": "skip", "grace": 10}
    )
    schedule_rows.remove("bare")

    delete = url("scheduledefinition_delete", "rows-poll")
    assert admin_client.post(delete, {"post": "yes"}).status_code == 302
    assert not ScheduleDefinition.objects.exists()
    assert not ScheduleState.objects.filter(name="rows-poll").exists()


def test_the_page_shows_relative_times_and_the_last_outcome(admin_client: Client) -> None:
    job = jobqueue.enqueue("test.noop")
    Job.objects.filter(pk=job.pk).update(state=Job.State.DEAD, finished_at=NOW)
    ScheduleState.objects.create(
        name="poll-feeds",
        last_slot=NOW - dt.timedelta(minutes=3, seconds=5),
        enqueued_slot=NOW - dt.timedelta(minutes=3, seconds=5),
        job_id=job.pk,
    )
    html = admin_client.get(url("schedulestate_changelist")).content.decode()
    assert "3 min ago" in html, html[html.index("<table") :]
    assert "in 25 s" in html and "in 15 h" in html
    assert f'<a href="{url("job_change", job.pk)}">#{job.pk}</a>' in html
    assert "jq-state-dead" in html  # the last outcome


def _actions(client: Client) -> tuple[str, int, int]:
    html = client.get(url("schedulestate_changelist")).content.decode()
    return html, html.count(">Pause</button>"), html.count(">Run now</button>")


def test_pause_resume_and_run_now_each_need_their_own_permission() -> None:
    page = url("schedulestate_changelist")
    viewer = login(make_user("viewer", "view_schedulestate"))
    html, pauses, runs = _actions(viewer)
    assert (pauses, runs) == (0, 0) and "jq-schedule-add" not in html
    # Forged POSTs are refused, and change nothing.
    for action in ("pause", "resume", "run", "delete"):
        assert viewer.post(page, {"action": action, "name": "poll-feeds"}).status_code == 403
    assert not ScheduleState.objects.exists() and not Job.objects.exists()

    pauser = login(make_user("pauser", "view_schedulestate", "pause_schedule"))
    assert _actions(pauser)[1:] == (2, 0)
    assert pauser.post(page, {"action": "run", "name": "poll-feeds"}).status_code == 403
    response = pauser.post(page, {"action": "pause", "name": "poll-feeds"}, follow=True)
    assert "Paused schedule &#x27;poll-feeds&#x27;" in response.content.decode()
    assert ScheduleState.objects.get(name="poll-feeds").paused
    assert ">Resume</button>" in _actions(pauser)[0]
    pauser.post(page, {"action": "resume", "name": "poll-feeds"})
    assert not ScheduleState.objects.get(name="poll-feeds").paused
    response = pauser.post(page, {"action": "pause", "name": "nope"}, follow=True)
    assert "Nothing was done: No schedule is named &#x27;nope&#x27;" in response.content.decode()

    runner = login(make_user("runner", "view_schedulestate", "run_schedule"))
    assert _actions(runner)[1:] == (0, 2)
    assert runner.post(page, {"action": "pause", "name": "poll-feeds"}).status_code == 403
    runner.post(page, {"action": "run", "name": "poll-feeds"})
    job = Job.objects.get()
    assert (job.type, job.queue, job.unique_key) == ("test.noop", "feeds", None)
    assert ScheduleState.objects.get(name="poll-feeds").run_job_id == job.pk
    # Without the page's view permission the action permission alone does nothing.
    blind = login(make_user("blind", "run_schedule", "pause_schedule"))
    assert blind.post(page, {"action": "run", "name": "poll-feeds"}).status_code == 403


def test_the_stored_schedule_forms_need_their_permissions() -> None:
    schedule_rows.add("rows-poll", {"handler": "test.noop", "every": 30})
    viewer = login(make_user("viewer", "view_schedulestate"))
    assert viewer.get(url("scheduledefinition_add")).status_code == 403
    assert viewer.post(url("scheduledefinition_add"), POLL_FORM).status_code == 403
    change = url("scheduledefinition_change", "rows-poll")
    assert viewer.post(change, {**POLL_FORM, "every": "5"}).status_code == 403
    delete = url("scheduledefinition_delete", "rows-poll")
    assert viewer.post(delete, {"post": "yes"}).status_code == 403
    assert ScheduleDefinition.objects.get(name="rows-poll").every == 30
    assert "(<a href" not in viewer.get(url("schedulestate_changelist")).content.decode()
    editor = login(make_user("editor", "view_schedulestate", "change_scheduledefinition"))
    assert change in editor.get(url("schedulestate_changelist")).content.decode()


def test_a_stored_schedule_that_cannot_run_is_listed_with_why(admin_client: Client) -> None:
    ScheduleDefinition.objects.create(name="gone", handler="no.more", every=5)
    html = admin_client.get(url("schedulestate_changelist")).content.decode()
    assert "Stored schedules not run" in html and "No handler is registered" in html
    assert url("scheduledefinition_change", "gone") in html
