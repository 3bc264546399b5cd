"""The admin actions: what they change, what they skip and say, who may run them, CSRF."""

from __future__ import annotations

import datetime as dt
import logging

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.test import Client
from django.utils import timezone

from django_jobqueue.admin import actions
from django_jobqueue.models import Job, JobDependency, Worker
from tests.support import admin_support as support
from tests.support.admin_support import Scenario, run_action, url
from tests.support.factories import JobFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator() -> Client:
    """Staff with Job's view and change permissions (no delete)."""
    return support.login(support.make_user("operator", "view_job", "change_job", "view_worker"))


def state(job: Job) -> str:
    job.refresh_from_db()
    return str(job.state)


def test_retry_jobs_revives_downstream_and_reports_skips(
    operator: Client, scenario: Scenario
) -> None:
    ids = [scenario.child_dead.pk, scenario.ready.pk, scenario.done.pk, scenario.container.pk]
    status, messages = run_action(operator, "job", "retry_jobs", ids, extra_attempts="2")
    assert status == 200
    assert state(scenario.child_dead) == "ready"
    assert scenario.child_dead.max_attempts == scenario.child_dead.attempts + 2
    # The job its failure cancelled waits again, and its container re-opened.
    assert state(scenario.downstream) == "waiting"
    assert state(scenario.container) == "waiting"
    [text] = messages
    assert text.startswith("Retried 1 job")
    assert "Skipped 3" in text
    assert f"#{scenario.ready.pk}: it is ready; only dead or cancelled jobs retry" in text
    assert f"#{scenario.container.pk}: it is a container" in text


def test_retry_jobs_default_budget_is_one(operator: Client, scenario: Scenario) -> None:
    run_action(operator, "deadjob", "retry_jobs", [scenario.dead.pk])
    assert state(scenario.dead) == "ready"
    assert scenario.dead.max_attempts == 4


def test_retry_jobs_rejects_a_bad_budget(operator: Client, scenario: Scenario) -> None:
    _, messages = run_action(operator, "job", "retry_jobs", [scenario.dead.pk], extra_attempts="0")
    assert state(scenario.dead) == "dead"
    assert any("from 1 to 100" in m for m in messages)


def test_cancel_jobs(operator: Client, scenario: Scenario) -> None:
    ids = [scenario.ready.pk, scenario.running.pk, scenario.done.pk]
    _, [text] = run_action(operator, "job", "cancel_jobs", ids)
    assert state(scenario.ready) == "cancelled"
    assert state(scenario.running) == "running" and scenario.running.cancel_requested
    assert state(scenario.done) == "done"
    assert text.startswith("Cancelled 2 jobs")
    assert f"#{scenario.running.pk} cancel requested" in text
    assert f"#{scenario.done.pk}: it has already finished" in text


def test_release_leases_frees_only_stuck_ones(operator: Client, scenario: Scenario) -> None:
    ids = [scenario.stuck.pk, scenario.running.pk, scenario.ready.pk]
    _, [text] = run_action(operator, "job", "release_leases", ids)
    scenario.stuck.refresh_from_db()
    assert (scenario.stuck.state, scenario.stuck.lease_owner) == ("ready", None)
    assert scenario.stuck.attempts == 1 and scenario.stuck.max_attempts >= 2
    assert state(scenario.running) == "running"
    assert text.startswith("Released 1 job")
    assert f"is held by live worker {scenario.live_worker.pk}" in text
    assert "it holds no lease" in text


def test_release_of_a_job_whose_cancel_was_requested_cancels_it(
    operator: Client, scenario: Scenario
) -> None:
    Job.objects.filter(pk=scenario.stuck.pk).update(cancel_requested=True)
    run_action(operator, "livelease", "release_leases", [scenario.stuck.pk])
    assert state(scenario.stuck) == "cancelled"


def test_release_is_refused_for_a_live_owner_whatever_its_job_ids_say(
    operator: Client, scenario: Scenario
) -> None:
    """A job claimed since the worker's last heartbeat is missing from its job_ids: still its."""
    Worker.objects.filter(pk=scenario.live_worker.pk).update(job_ids=[])
    _, [text] = run_action(operator, "livelease", "release_leases", [scenario.running.pk])
    assert state(scenario.running) == "running"
    assert scenario.running.lease_owner == scenario.live_worker.pk
    assert text.startswith("Released 0 jobs")
    assert f"held by live worker {scenario.live_worker.pk}" in text
    assert "never released" in text and "cancel the job instead" in text


def test_job_page_offers_release_only_when_the_worker_is_gone(
    operator: Client, scenario: Scenario
) -> None:
    Worker.objects.filter(pk=scenario.live_worker.pk).update(job_ids=[])
    live = operator.get(url("job_change", scenario.running.pk)).content.decode()
    assert 'value="cancel_jobs"' in live and 'value="release_leases"' not in live
    assert "Release lease is not offered: its worker is alive" in live
    stuck = operator.get(url("job_change", scenario.stuck.pk)).content.decode()
    assert 'value="cancel_jobs"' in stuck and 'value="release_leases"' in stuck
    assert "Its worker is gone" in stuck
    Worker.objects.filter(pk=scenario.stale_worker.pk).delete()
    orphan = operator.get(url("job_change", scenario.stuck.pk)).content.decode()
    assert 'value="release_leases"' in orphan and "(worker gone)" in orphan


def test_delete_finished_jobs_keeps_what_is_needed(scenario: Scenario) -> None:
    client = support.login(support.make_user("janitor", "view_job", "change_job", "delete_job"))
    upstream = JobFactory(state=Job.State.DONE, finished_at=timezone.now(), has_dependents=True)
    JobDependency.objects.create(job=JobFactory(state=Job.State.WAITING), depends_on=upstream)
    family = [scenario.container, scenario.child_done, scenario.child_dead, scenario.downstream]
    ids = [scenario.done.pk, scenario.ready.pk, upstream.pk, *[job.pk for job in family]]
    _, [text] = run_action(client, "job", "delete_finished_jobs", ids)
    assert not Job.objects.filter(pk__in=[scenario.done.pk, *[j.pk for j in family]]).exists()
    assert Job.objects.filter(pk__in=[scenario.ready.pk, upstream.pk]).count() == 2
    assert text.startswith("Deleted 5 jobs")
    assert f"#{scenario.ready.pk}: it is ready, not finished" in text
    assert f"#{upstream.pk}: unfinished job" in text


def test_delete_keeps_children_of_unfinished_containers_and_containers_with_children(
    scenario: Scenario,
) -> None:
    client = support.login(support.make_user("janitor", "view_job", "delete_job", "change_job"))
    box = JobFactory(is_container=True, state=Job.State.WAITING)
    child = JobFactory(parent=box, state=Job.State.DONE, finished_at=timezone.now())
    _, [text] = run_action(client, "job", "delete_finished_jobs", [child.pk, scenario.container.pk])
    assert Job.objects.filter(pk__in=[child.pk, scenario.container.pk]).count() == 2
    assert f"its container {box.pk} is waiting" in text
    assert "container with children left" in text


def test_actions_are_bounded(operator: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page's selection (here a forged one, larger than any page) is bounded; "select all"
    asks first (tests/admin/test_admin_bulk.py)."""
    monkeypatch.setattr(actions, "ACTION_LIMIT", 3)
    jobs = JobFactory.create_batch(5)
    data = {
        "action": "cancel_jobs",
        "index": "0",
        "_selected_action": [str(job.pk) for job in jobs],
    }
    response = operator.post(url("job_changelist"), data, follow=True)
    [text] = [str(m) for m in response.context["messages"]]
    assert text.startswith("Cancelled 3 jobs") and "2 selected jobs were not handled" in text
    assert Job.objects.filter(state="cancelled").count() == 3


# -- permissions and CSRF -------------------------------------------------------------------


def test_view_only_users_cannot_run_actions(scenario: Scenario) -> None:
    client = support.login(support.make_user("viewer", "view_job"))
    for action in ("retry_jobs", "cancel_jobs", "release_leases", "delete_finished_jobs"):
        run_action(client, "job", action, [j.pk for j in scenario.jobs()])
    assert [state(j) for j in scenario.jobs()] == [
        "ready",
        "running",
        "running",
        "dead",
        "done",
        "dead",
        "done",
        "dead",
        "cancelled",
    ]
    assert Job.objects.count() == len(scenario.jobs())


def test_change_permission_does_not_allow_deleting(operator: Client, scenario: Scenario) -> None:
    content = operator.get(url("job_changelist")).content.decode()
    assert "retry_jobs" in content and "cancel_jobs" in content
    assert "delete_finished_jobs" not in content
    run_action(operator, "job", "delete_finished_jobs", [scenario.done.pk])
    assert Job.objects.filter(pk=scenario.done.pk).exists()


def test_staff_without_permission_gets_403_on_action_posts(scenario: Scenario) -> None:
    client = support.login(support.make_user("nobody"))
    data = {"action": "cancel_jobs", "_selected_action": [str(scenario.ready.pk)]}
    assert client.post(url("job_changelist"), data).status_code == 403
    assert state(scenario.ready) == "ready"


def test_anonymous_action_posts_go_to_login(client: Client, scenario: Scenario) -> None:
    data = {"action": "cancel_jobs", "_selected_action": [str(scenario.ready.pk)]}
    response = client.post(url("job_changelist"), data)
    assert response.status_code == 302 and "/login/" in response["Location"]
    assert state(scenario.ready) == "ready"


def test_actions_need_the_csrf_token(scenario: Scenario) -> None:
    user = support.make_user("operator", "view_job", "change_job")
    client = support.login(user, enforce_csrf_checks=True)
    data = {"action": "cancel_jobs", "_selected_action": [str(scenario.ready.pk)]}
    assert client.post(url("job_changelist"), data).status_code == 403
    assert state(scenario.ready) == "ready"
    token = support.csrf_token(client, url("job_changelist"))
    response = client.post(url("job_changelist"), {**data, "csrfmiddlewaretoken": token})
    assert response.status_code == 302
    assert state(scenario.ready) == "cancelled"


def test_a_stale_lease_read_changes_nothing(operator: Client, scenario: Scenario) -> None:
    """A lease renewed by its worker since the page was drawn is not released."""
    Worker.objects.filter(pk=scenario.stale_worker.pk).update(
        expires_at=timezone.now() + dt.timedelta(seconds=30), job_ids=[scenario.stuck.pk]
    )
    _, [text] = run_action(operator, "livelease", "release_leases", [scenario.stuck.pk])
    assert state(scenario.stuck) == "running" and "held by live worker" in text


def test_job_page_buttons_run_the_action_and_come_back(
    operator: Client, scenario: Scenario
) -> None:
    page = operator.get(url("job_change", scenario.dead.pk)).content.decode()
    assert 'value="retry_jobs"' in page and 'value="cancel_jobs"' not in page
    running = operator.get(url("job_change", scenario.running.pk)).content.decode()
    assert 'value="cancel_jobs"' in running and 'value="release_leases"' not in running
    stuck = operator.get(url("job_change", scenario.stuck.pk)).content.decode()
    assert 'value="release_leases"' in stuck
    done = operator.get(url("job_change", scenario.done.pk)).content.decode()
    assert "jq-job-action" not in done
    data = {"action": "retry_jobs", "_selected_action": [str(scenario.dead.pk)], "_job_page": "1"}
    response = operator.post(url("job_changelist"), data, follow=True)
    assert response.redirect_chain[-1][0] == url("job_change", scenario.dead.pk)
    assert state(scenario.dead) == "ready"
    assert any(str(m).startswith("Retried 1 job") for m in response.context["messages"])


def test_job_page_offers_viewers_no_buttons(scenario: Scenario) -> None:
    client = support.login(support.make_user("viewer", "view_job"))
    page = client.get(url("job_change", scenario.dead.pk)).content.decode()
    assert "jq-job-action" not in page
    data = {"action": "retry_jobs", "_selected_action": [str(scenario.dead.pk)], "_job_page": "1"}
    client.post(url("job_changelist"), data)
    assert state(scenario.dead) == "dead"


# -- the trace each action leaves ------------------------------------------------------------


def entries(job: Job) -> list[tuple[str, int, str]]:
    """(user, action flag, message) of the LogEntry rows of `job`, oldest first."""
    rows = LogEntry.objects.filter(
        content_type=ContentType.objects.get_for_model(Job), object_id=str(job.pk)
    ).order_by("pk")
    return [(e.user.username, e.action_flag, e.get_change_message()) for e in rows]


def test_each_action_writes_a_log_entry_per_job_and_an_info_line(
    scenario: Scenario, caplog: pytest.LogCaptureFixture
) -> None:
    client = support.login(support.make_user("ops", "view_job", "change_job", "delete_job"))
    caplog.set_level(logging.INFO, logger="django_jobqueue.admin.actions")
    run_action(client, "deadjob", "retry_jobs", [scenario.dead.pk], extra_attempts="2")
    run_action(client, "job", "cancel_jobs", [scenario.ready.pk, scenario.running.pk])
    run_action(client, "livelease", "release_leases", [scenario.stuck.pk, scenario.running.pk])
    run_action(client, "job", "delete_finished_jobs", [scenario.done.pk, scenario.running.pk])
    assert entries(scenario.dead) == [("ops", CHANGE, "Retried (+2 attempts): ready")]
    assert entries(scenario.running) == [("ops", CHANGE, "Cancelled: cancel requested")]
    assert entries(scenario.stuck) == [("ops", CHANGE, "Released lease: ready")]
    assert entries(scenario.done) == [("ops", DELETION, "")]
    assert entries(scenario.ready) == [("ops", CHANGE, "Cancelled: cancelled")]
    assert LogEntry.objects.count() == 5
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert lines == [
        f"Admin user ops retried (+2 attempts) 1 jobs ids=[{scenario.dead.pk}] (0 skipped)",
        f"Admin user ops cancelled 2 jobs ids=[{scenario.ready.pk},{scenario.running.pk}]"
        " (0 skipped)",
        f"Admin user ops released lease 1 jobs ids=[{scenario.stuck.pk}] (1 skipped)",
        f"Admin user ops deleted 1 jobs ids=[{scenario.done.pk}] (1 kept)",  # running: kept
    ]
    history = client.get(url("job_history", scenario.dead.pk)).content.decode()
    assert "Retried (+2 attempts): ready" in history and "ops" in history
    page = client.get(url("job_change", scenario.ready.pk)).content.decode()
    assert "cancelled by operator ops at " in page


def test_the_log_line_of_a_large_batch_is_bounded(
    operator: Client, caplog: pytest.LogCaptureFixture
) -> None:
    jobs = JobFactory.create_batch(25)
    caplog.set_level(logging.INFO, logger="django_jobqueue.admin.actions")
    run_action(operator, "job", "cancel_jobs", [job.pk for job in jobs])
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    shown = ",".join(str(job.pk) for job in jobs[: actions.SHOWN_SKIPS])
    assert line == f"Admin user operator cancelled 25 jobs ids=[{shown} and 15 more] (0 skipped)"
    assert LogEntry.objects.filter(action_flag=CHANGE).count() == 25
