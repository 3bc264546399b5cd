"""A job page's summary card and its actions, and enqueueing from the admin (issue 51).

The card says what an operator triages by (state, handler and version, attempts, what it waits
for or which limit holds it back, progress, last error, worker, times) and offers the actions
that fit the state. The enqueue form and "Run again" each need a permission of their own: a
user without it sees no button, and a forged POST is refused. Bad input is shown on the form
and nothing is written.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from django.contrib.admin.models import ADDITION, LogEntry
from django.test import Client
from django.utils import timezone

import django_jobqueue as jobqueue
from django_jobqueue import pausing
from django_jobqueue.models import Job
from tests.support import admin_support as support
from tests.support.admin_support import csrf_token, login, make_user, url
from tests.support.factories import JobFactory

pytestmark = pytest.mark.django_db

LIMITS = {"api": {"concurrency": 1}, "tenant:*": {"concurrency": 1, "rate": "10/m"}}


@pytest.fixture(autouse=True)
def limits(settings: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "LIMITS": LIMITS}


def card(html: str) -> str:
    """The card's HTML on a job page."""
    return html.split('<section class="jq-card"')[1].split("</section>")[0]


def card_row(html: str, label: str) -> str:
    """One line of the card, its value's HTML."""
    slug = label.replace(" ", "-")
    return card(html).split(f'class="jq-card-{slug}"')[1].split("</tr>")[0]


def page(client: Client, job: Job) -> str:
    response = client.get(url("job_change", job.pk))
    assert response.status_code == 200
    return response.content.decode()


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]]


# -- the card -------------------------------------------------------------------------------


def test_a_dead_jobs_card_says_what_failed_and_what_retry_does(admin_client: Client) -> None:
    scenario = support.build()
    html = page(admin_client, scenario.dead)
    assert "jq-state-dead" in card_row(html, "state")
    assert "<code>reports.fetch</code>" in card_row(html, "handler")
    assert "3 of 3 (used up)" in card_row(html, "attempts")
    assert "RuntimeError: upstream API returned 502" in card_row(html, "last error")
    assert "(attempt 3)" in card_row(html, "last error")
    assert "finished" in card_row(html, "times")
    actions = card(html).split('class="jq-card-actions"')[1]
    assert 'value="retry_jobs"' in actions and 'name="extra_attempts"' in actions
    assert "Attempts are never reset: it keeps its 3" in actions
    assert 'value="cancel_jobs"' not in actions


def test_one_date_format_throughout_the_page(admin_client: Client) -> None:
    later = timezone.now() + dt.timedelta(hours=2)
    job = jobqueue.enqueue("emails.send", {"to": "a@x"}, run_after=later)
    html = page(admin_client, job)
    # Django's default DATETIME_FORMAT ("Dec. 7, 2026, 6:30 p.m.") never appears: every
    # moment is a <time> element in the one format (2026-12-07 18:30:00).
    assert not re.search(r"\b[ap]\.m\.|\b(midnight|noon)\b", html)
    assert not re.search(r"\b(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.? \d", html)
    moments = re.findall(r"<time [^>]*>([^<]*)</time>", html)
    assert moments and all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", m) for m in moments)
    for other in support.build().jobs():  # every kind of job page: one format there too
        text = page(admin_client, other)
        assert not re.search(r"\b[ap]\.m\.|\b(midnight|noon)\b", text), other.state
        found = re.findall(r"<time [^>]*>([^<]*)</time>", text)
        assert all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", m) for m in found)
    local = timezone.localtime(later).strftime("%Y-%m-%d %H:%M:%S")
    assert local in card_row(html, "waits for") and local in card_row(html, "times")
    assert 'class="jq-job-action jq-run-now"' in card(html)


def test_a_running_jobs_card_names_its_worker_and_cancel_asks_first(admin_client: Client) -> None:
    scenario = support.build()
    html = page(admin_client, scenario.running)
    worker = card_row(html, "worker")
    assert scenario.live_worker.pk in worker and "alive" in worker
    assert "running for" in card_row(html, "times")
    actions = card(html).split('class="jq-card-actions"')[1]
    # A running job's cancel is behind a confirmation that says what it does.
    assert '<details class="jq-confirm"><summary>Cancel…</summary>' in actions
    assert "its handler is asked to stop" in actions
    assert "Release lease" not in actions  # its worker is alive: the job would run twice


def test_a_stuck_jobs_card_offers_release_lease_and_says_what_it_means(
    admin_client: Client,
) -> None:
    scenario = support.build()
    html = page(admin_client, scenario.stuck)
    assert "gone: no heartbeat for a lease TTL" in card_row(html, "worker")
    actions = card(html).split('class="jq-card-actions"')[1]
    assert 'value="release_leases"' in actions
    assert "as the reclaim of an expired lease puts it" in actions
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert token
    response = admin_client.post(
        url("job_changelist"),
        {"action": "release_leases", "_selected_action": [scenario.stuck.pk], "_job_page": "1",
         "index": "0"},
        follow=True,
    )  # fmt: skip
    assert response.redirect_chain[-1][0] == url("job_change", scenario.stuck.pk)
    stuck = Job.objects.get(pk=scenario.stuck.pk)
    assert stuck.state == Job.State.READY and stuck.lease_owner is None
    assert stuck.attempts == 1 and stuck.max_attempts >= 2


def test_retry_from_the_card_gives_the_extra_attempts_asked_for(admin_client: Client) -> None:
    scenario = support.build()
    admin_client.post(
        url("job_changelist"),
        {"action": "retry_jobs", "_selected_action": [scenario.dead.pk], "_job_page": "1",
         "index": "0", "extra_attempts": "2"},
    )  # fmt: skip
    dead = Job.objects.get(pk=scenario.dead.pk)
    assert dead.state == Job.State.READY and (dead.attempts, dead.max_attempts) == (3, 5)


def test_a_ready_job_says_which_limit_holds_it_back(admin_client: Client) -> None:
    now = timezone.now()
    JobFactory(
        state=Job.State.RUNNING, attempts=1, uses={"tenant:42": 1}, lease_owner="w",
        lease_expires=now + dt.timedelta(seconds=30), started_at=now,
    )  # fmt: skip
    held = jobqueue.enqueue("limits.work", uses={"tenant:42": 1})
    free = jobqueue.enqueue("limits.work", uses={"tenant:7": 1})
    line = card_row(page(admin_client, held), "held back by")
    assert "tenant:42 (tenant:*)" in line and "1 of 1 units in flight" in line
    line = card_row(page(admin_client, free), "held back by")
    assert "nothing: it starts when a worker of its queue has a free slot" in line
    pausing.pause_queue("default")
    assert "its queue default is paused" in card_row(page(admin_client, free), "held back by")


def test_a_waiting_jobs_card_says_what_it_waits_for(admin_client: Client) -> None:
    first = jobqueue.enqueue("emails.send", {"to": "a@x"})
    then = jobqueue.enqueue("emails.send", {"to": "b@x"}, depends_on=[first])
    line = card_row(page(admin_client, then), "waits for")
    assert "upstream jobs to be done:" in line and f"#{first.pk}" in line


def test_a_user_without_the_change_permission_sees_the_card_without_actions() -> None:
    scenario = support.build()
    viewer = login(make_user("viewer", "view_job"))
    html = page(viewer, scenario.dead)
    assert "3 of 3 (used up)" in card_row(html, "attempts")
    assert "jq-job-action" not in card(html)
    assert "No action of yours fits" in card(html)


# -- enqueue from the admin -----------------------------------------------------------------


def form_errors(response: Any) -> dict[str, list[str]]:
    return {k: [str(e) for e in v] for k, v in response.context["form"].errors.items()}


def test_enqueue_a_job_from_the_form(admin_client: Client) -> None:
    html = admin_client.get(url("job_changelist")).content.decode()
    assert f'href="{url("job_enqueue")}"' in html
    form = admin_client.get(url("job_enqueue")).content.decode()
    assert '<option value="emails.send">' in form
    assert "jobqueue.admin_bulk_action" not in form  # the queue's own handler is not offered
    later = timezone.localtime(timezone.now() + dt.timedelta(hours=1)).replace(microsecond=0)
    response = admin_client.post(
        url("job_enqueue"),
        {"handler": "limits.work", "args": '{"n": 1}', "queue": "bulk", "priority": "5",
         "run_after": later.strftime("%Y-%m-%dT%H:%M:%S"), "uses": '{"tenant:42": 1}'},
        follow=True,
    )  # fmt: skip
    job = Job.objects.get(type="limits.work")
    assert response.redirect_chain[-1][0] == url("job_change", job.pk)
    assert messages_of(response) == [f"Enqueued job #{job.pk} (limits.work): it is scheduled."]
    assert (job.args, job.queue, job.priority, job.uses) == ({"n": 1}, "bulk", 5, {"tenant:42": 1})
    assert job.state == Job.State.SCHEDULED and job.run_after == later
    entry = LogEntry.objects.get(object_id=str(job.pk))
    assert entry.action_flag == ADDITION and entry.user.username == "admin"


def test_the_forms_defaults_are_enqueues(admin_client: Client) -> None:
    admin_client.post(url("job_enqueue"), {"handler": "emails.send", "args": "", "uses": ""})
    job = Job.objects.get(type="emails.send")
    assert (job.args, job.queue, job.priority, job.uses, job.state) == (
        {}, "default", 0, None, Job.State.READY,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("data", "field", "text"),
    [
        ({"args": "{to: 1}"}, "args", "The arguments is not JSON"),
        ({"args": "[1, 2]"}, "args", "The arguments must be a JSON object"),
        ({"args": '{"x": NaN}'}, "args", "cannot be stored"),
        ({"handler": "no.such.handler"}, "handler", "Select a valid choice"),
        ({"uses": '{"nope": 1}'}, "uses", "'nope' is not a resource of JOBQUEUE['LIMITS']"),
        ({"uses": '{"api": 0}'}, "uses", "must be an integer >= 1"),
        ({"uses": "[1]"}, "uses", "Uses must be a JSON object"),
        ({"queue": "a\x07b"}, "queue", "queue must not contain control characters"),
        ({"priority": str(2**40)}, "priority", "priority"),
        ({"priority": "high"}, "priority", "Enter a whole number"),
        ({"run_after": "tomorrow"}, "run_after", "Enter a valid date/time"),
    ],
)
def test_bad_input_is_shown_on_the_form_and_nothing_is_written(
    admin_client: Client, data: dict[str, str], field: str, text: str
) -> None:
    post = {"handler": "limits.work", "args": "{}", **data}
    response = admin_client.post(url("job_enqueue"), post)
    assert response.status_code == 200
    errors = form_errors(response)
    assert list(errors) == [field] and text in errors[field][0], errors
    assert "Nothing was enqueued" in response.content.decode()
    assert not Job.objects.exists()


def test_the_form_is_filled_from_a_job(admin_client: Client) -> None:
    job = jobqueue.enqueue("limits.work", {"n": 7}, queue="bulk", priority=3, uses={"api": 1})
    form = admin_client.get(url("job_enqueue") + f"?from={job.pk}").context["form"]
    assert form.initial["handler"] == "limits.work" and '"n": 7' in form.initial["args"]
    assert (form.initial["queue"], form.initial["priority"]) == ("bulk", 3)
    assert form.initial["uses"] == '{"api": 1}'
    assert f"{url('job_enqueue')}?from={job.pk}" in page(admin_client, job)


def test_run_again_enqueues_a_job_with_the_same_arguments(admin_client: Client) -> None:
    scenario = support.build()
    response = admin_client.post(url("job_run_again", scenario.dead.pk), follow=True)
    again = Job.objects.order_by("-pk").first()
    assert again is not None and again.pk != scenario.dead.pk
    assert response.redirect_chain[-1][0] == url("job_change", again.pk)
    assert messages_of(response) == [
        f"Enqueued job #{again.pk} with the arguments of job #{scenario.dead.pk}: it is ready."
    ]
    dead = scenario.dead
    assert (again.type, again.args, again.queue, again.priority, again.attempts) == (
        dead.type, dead.args, dead.queue, dead.priority, 0,
    )  # fmt: skip
    assert LogEntry.objects.filter(object_id=str(again.pk), action_flag=ADDITION).exists()


def test_run_again_keeps_a_unique_key_held_by_an_unfinished_job(admin_client: Client) -> None:
    job = jobqueue.enqueue("emails.send", {"to": "a@x"}, unique_key="mail:a")
    response = admin_client.post(url("job_run_again", job.pk), follow=True)
    assert messages_of(response) == [
        f"Nothing was enqueued: job #{job.pk} holds unique key 'mail:a' and has not finished "
        "(ready)."
    ]
    assert Job.objects.count() == 1


@pytest.mark.parametrize(
    ("permission", "target", "button"),
    [
        ("enqueue_job", "job_enqueue", "Change the arguments and enqueue"),
        ("run_again", "job_run_again", "Run again"),
    ],
)
def test_each_needs_its_own_permission(permission: str, target: str, button: str) -> None:
    job = JobFactory(
        type="emails.send", state=Job.State.DONE, args={"to": "a@x"}, attempts=1,
        finished_at=timezone.now(),
    )  # fmt: skip
    address = url(target, job.pk) if target == "job_run_again" else url(target)
    post = {"handler": "emails.send", "args": "{}"}
    # Every other permission of the job pages is not enough.
    others = ["view_job", "change_job", "delete_job", "send_event", "run_now"]
    others += [p for p in ("enqueue_job", "run_again") if p != permission]
    changer = login(make_user("changer", *others))
    html = page(changer, job)
    assert button not in html
    if permission == "enqueue_job":
        assert "Enqueue a job" not in changer.get(url("job_changelist")).content.decode()
        assert changer.get(address).status_code == 403
    assert changer.post(address, post).status_code == 403
    assert Job.objects.count() == 1
    allowed = login(make_user("allowed", "view_job", permission), enforce_csrf_checks=True)
    assert allowed.post(address, post).status_code == 403  # no CSRF token: forged
    assert Job.objects.count() == 1
    assert button in page(allowed, job)
    token = csrf_token(allowed, url("job_change", job.pk))
    allowed.post(address, {**post, "csrfmiddlewaretoken": token})
    assert Job.objects.count() == 2


def test_a_job_that_no_longer_exists_cannot_be_run_again(admin_client: Client) -> None:
    response = admin_client.post(url("job_run_again", 999_999), follow=True)
    assert messages_of(response) == ["Nothing was enqueued: no such job, or it is a container."]
    assert admin_client.get(url("job_run_again", 1)).status_code == 405


def test_a_failed_enqueue_keeps_what_was_typed(admin_client: Client) -> None:
    response = admin_client.post(
        url("job_enqueue"), {"handler": "limits.work", "args": '{"n": 1}', "uses": '{"x": 1}'}
    )
    html = response.content.decode()
    assert "{&quot;n&quot;: 1}" in html and "errornote" in html


def test_anonymous_users_are_sent_to_login(client: Client) -> None:
    job = JobFactory()
    for target in (url("job_enqueue"), url("job_run_again", job.pk)):
        response = client.post(target, {"handler": "emails.send"})
        assert response.status_code == 302 and "/login/" in response["Location"], target
    assert Job.objects.count() == 1
