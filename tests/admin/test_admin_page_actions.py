"""A job page's own actions: send the event a waiting job waits for, run a scheduled job now.
Each under its own permission: without it no button, and a forged POST does nothing."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.utils import timezone

import django_jobqueue as jobqueue
from django_jobqueue.models import Job, JobEvent
from django_jobqueue.testing import run_jobs
from tests.support.admin_support import csrf_token, login, make_user, url
from tests.support.factories import JobFactory

pytestmark = pytest.mark.django_db


def waiting_for(key: str) -> Job:
    """A job suspended in ctx.wait_for_event(key) by a real run of its handler."""
    job = jobqueue.enqueue("durable.waiter", {"key": key}, max_attempts=1)
    run_jobs()
    job.refresh_from_db()
    assert job.state == Job.State.WAITING
    return job


def scheduled() -> Job:
    later = timezone.now() + dt.timedelta(hours=1)
    return jobqueue.enqueue("emails.send", {"to": "a@x"}, run_after=later)


def messages_of(response: object) -> list[str]:
    return [str(m) for m in response.context["messages"]]  # type: ignore[attr-defined]


def test_send_event_wakes_the_job_with_the_payload(admin_client: Client) -> None:
    job = waiting_for("approval:7")
    page = admin_client.get(url("job_change", job.pk)).content.decode()
    assert "Send event" in page and "<code>approval:7</code>" in page
    response = admin_client.post(
        url("job_send_event", job.pk), {"payload": '{"by": "ann"}'}, follow=True
    )
    assert "Sent event 'approval:7'" in " ".join(messages_of(response))
    assert Job.objects.get(pk=job.pk).state == Job.State.READY
    run_jobs()
    job.refresh_from_db()
    assert job.state == Job.State.DONE and job.result == {"payload": {"by": "ann"}}
    entry = LogEntry.objects.get(object_id=str(job.pk), change_message__startswith="Sent event")
    assert entry.user.username == "admin"


def test_an_empty_payload_sends_null(admin_client: Client) -> None:
    job = waiting_for("go")
    admin_client.post(url("job_send_event", job.pk), {"payload": ""})
    run_jobs()
    assert Job.objects.get(pk=job.pk).result == {"payload": None}


def test_bad_json_sends_nothing_and_says_why(admin_client: Client) -> None:
    job = waiting_for("approval:8")
    response = admin_client.post(
        url("job_send_event", job.pk), {"payload": "{by: ann}"}, follow=True
    )
    [message] = messages_of(response)
    assert message.startswith("Nothing was sent: the payload is not JSON")
    assert Job.objects.get(pk=job.pk).state == Job.State.WAITING
    assert not JobEvent.objects.filter(key="approval:8", sent_at__isnull=False).exists()


def test_send_event_is_offered_only_to_a_job_that_waits_for_an_event(
    admin_client: Client,
) -> None:
    for job in [
        JobFactory(state=Job.State.READY),
        JobFactory(state=Job.State.WAITING),  # waits on upstream jobs, not an event
        scheduled(),
    ]:
        page = admin_client.get(url("job_change", job.pk)).content.decode()
        assert "Send event" not in page, job.state
    ready = JobFactory(state=Job.State.READY)
    response = admin_client.post(url("job_send_event", ready.pk), {"payload": "1"}, follow=True)
    assert messages_of(response) == [
        f"Nothing was sent: job #{ready.pk} waits for no event (it is ready)."
    ]
    assert not JobEvent.objects.exists()


def test_run_now_makes_a_scheduled_job_ready(admin_client: Client) -> None:
    job = scheduled()
    assert "Run now" in admin_client.get(url("job_change", job.pk)).content.decode()
    response = admin_client.post(url("job_run_now", job.pk), follow=True)
    assert messages_of(response) == [f"Job #{job.pk} is due now: it is ready."]
    job.refresh_from_db()
    assert job.state == Job.State.READY and job.run_after <= timezone.now()
    run_jobs(ignore_delays=False)
    assert Job.objects.get(pk=job.pk).state == Job.State.DONE


def test_run_now_is_offered_only_to_a_scheduled_job(admin_client: Client) -> None:
    job = JobFactory(state=Job.State.READY)
    assert "Run now" not in admin_client.get(url("job_change", job.pk)).content.decode()
    response = admin_client.post(url("job_run_now", job.pk), follow=True)
    assert messages_of(response) == [f"Nothing was changed: job #{job.pk} is ready, not scheduled."]


def test_run_now_ends_a_durable_sleep_early() -> None:
    job = jobqueue.enqueue("durable.sleeper", {"seconds": 3600})
    run_jobs(ignore_delays=False)
    assert Job.objects.get(pk=job.pk).state == Job.State.SCHEDULED
    assert jobqueue.run_now(job) is True
    assert jobqueue.run_now(job.pk) is False  # ready now: nothing more to do
    run_jobs(ignore_delays=False)
    assert Job.objects.get(pk=job.pk).state == Job.State.DONE


@pytest.mark.parametrize(
    ("action", "permission", "button"),
    [("job_send_event", "send_event", "Send event"), ("job_run_now", "run_now", "Run now")],
)
def test_each_action_needs_its_own_permission(action: str, permission: str, button: str) -> None:
    job = waiting_for("approval:9") if permission == "send_event" else scheduled()
    target = url(action, job.pk)
    page = url("job_change", job.pk)
    # Change permission alone (every other action's) is not enough.
    changer = login(make_user("changer", "view_job", "change_job"))
    assert button not in changer.get(page).content.decode()
    assert changer.post(target, {"payload": "1"}).status_code == 403
    assert Job.objects.get(pk=job.pk).state == job.state
    allowed = login(make_user("allowed", "view_job", permission), enforce_csrf_checks=True)
    assert allowed.get(target).status_code == 405
    assert allowed.post(target, {"payload": "1"}).status_code == 403  # no CSRF token
    assert Job.objects.get(pk=job.pk).state == job.state
    token = csrf_token(allowed, page)
    assert button in allowed.get(page).content.decode()
    allowed.post(target, {"payload": "1", "csrfmiddlewaretoken": token})
    assert Job.objects.get(pk=job.pk).state == Job.State.READY
