"""The admin's pause of a resource (Limits page) and of a workflow (job page), each under its
own permission (without it no button, and a forged POST does nothing), and the marks of
paused work on the jobs list, the job page and the Limits page."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.utils import timezone

import django_jobqueue as jobqueue
from django_jobqueue import pausing
from django_jobqueue.models import Job, PausedResource, PausedWorkflow
from tests.support.admin_support import csrf_token, login, make_user, url
from tests.support.factories import JobFactory

pytestmark = pytest.mark.django_db

LIMITS = {"api": {"concurrency": 2}, "tenant:*": {"concurrency": 1}}


@pytest.fixture(autouse=True)
def limits(settings: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "LIMITS": LIMITS}


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def test_resources_are_paused_and_resumed_from_the_limits_page(admin_client: Client) -> None:
    jobqueue.enqueue("limits.work", uses={"tenant:42": 1})
    page = url("limit_changelist")
    html = admin_client.get(page).content.decode()
    assert 'id="jq-paused-resources"' in html and "No resource is paused." in html
    response = admin_client.post(
        page, {"action": "pause_resource", "name": "tenant:*"}, follow=True
    )
    assert messages_of(response)[0].startswith("Paused resources matching 'tenant:*'")
    assert pausing.paused_resources() == ("tenant:*",)
    overview = admin_client.get(url("queueoverview_changelist")).content.decode()
    assert "tenant:*" in overview.split('id="jq-paused-work"')[1].split("</tr>")[0]
    html = admin_client.get(page).content.decode()
    row = html.split('<th scope="row">tenant:42')[1].split("</tr>")[0]
    assert "paused (tenant:*)" in row
    admin_client.post(page, {"action": "pause_resource", "name": "api"})
    html = admin_client.get(page).content.decode()
    assert "paused</span>" in html.split('<th scope="row">api')[1].split("</th>")[0]
    response = admin_client.post(
        page, {"action": "resume_resource", "name": "tenant:*"}, follow=True
    )
    assert messages_of(response) == ["Resumed resources matching 'tenant:*'."]
    assert pausing.paused_resources() == ("api",)
    response = admin_client.post(
        page, {"action": "pause_resource", "name": "tenant:4*2"}, follow=True
    )
    assert "Nothing was changed" in messages_of(response)[0]
    assert pausing.paused_resources() == ("api",)


def test_pausing_a_resource_needs_its_own_permission() -> None:
    page = url("limit_changelist")
    # The change permission of limits (every other action's there) is not enough.
    changer = login(make_user("changer", "view_limit", "change_limit"))
    html = changer.get(page).content.decode()
    assert 'id="jq-resource-pause"' not in html and "resume_resource" not in html
    assert changer.post(page, {"action": "pause_resource", "name": "api"}).status_code == 403
    assert not PausedResource.objects.exists()
    # Nor is the permission without the page's view permission.
    blind = login(make_user("blind", "pause_resource"))
    assert blind.post(page, {"action": "pause_resource", "name": "api"}).status_code == 403
    pauser = login(make_user("pauser", "view_limit", "pause_resource"), enforce_csrf_checks=True)
    html = pauser.get(page).content.decode()
    assert 'id="jq-resource-pause"' in html and "Change a limit" not in html
    assert pauser.post(page, {"action": "pause_resource", "name": "api"}).status_code == 403
    assert not PausedResource.objects.exists()  # no CSRF token
    token = csrf_token(pauser, page)
    pauser.post(page, {"action": "pause_resource", "name": "api", "csrfmiddlewaretoken": token})
    assert pausing.paused_resources() == ("api",)
    # and it allows no other action of the page
    data = {"action": "set", "name": "api", "concurrency": "5", "csrfmiddlewaretoken": token}
    assert pauser.post(page, data).status_code == 403


def test_a_workflow_is_paused_and_resumed_from_its_job_page(admin_client: Client) -> None:
    with jobqueue.container("flow") as box:
        child = jobqueue.enqueue("limits.work", parent=box)
    page = admin_client.get(url("job_change", box.pk)).content.decode()
    assert "Pause workflow" in page and "Resume workflow" not in page
    response = admin_client.post(url("job_pause", box.pk), follow=True)
    assert messages_of(response)[0].startswith(f"Paused workflow #{box.pk}")
    assert pausing.paused_workflows() == (box.pk,)
    page = response.content.decode()
    assert "Resume workflow" in page and "Pause workflow" not in page
    assert f"paused: workflow #{box.pk} is paused" in page
    child_page = admin_client.get(url("job_change", child.pk)).content.decode()
    assert "paused: its workflow is paused" in child_page
    listed = admin_client.get(url("job_changelist")).content.decode()
    assert listed.count('class="jq-paused"') == 2
    overview = admin_client.get(url("queueoverview_changelist")).content.decode()
    assert f">#{box.pk}</a>" in overview.split('id="jq-paused-work"')[1].split("</tr>")[0]
    assert LogEntry.objects.filter(change_message="Paused workflow").exists()
    response = admin_client.post(url("job_pause", box.pk), follow=True)
    assert messages_of(response) == [f"Workflow #{box.pk} was paused already."]
    response = admin_client.post(url("job_resume", box.pk), follow=True)
    assert messages_of(response) == [f"Resumed workflow #{box.pk}."]
    assert not PausedWorkflow.objects.exists()
    assert 'class="jq-paused"' not in admin_client.get(url("job_changelist")).content.decode()
    response = admin_client.post(url("job_pause", 999999), follow=True)
    assert messages_of(response) == ["Nothing was done: no such job."]


def test_the_jobs_list_marks_jobs_held_by_a_paused_resource_or_queue(
    admin_client: Client,
) -> None:
    held = jobqueue.enqueue("limits.work", uses={"tenant:1": 1})
    queued = jobqueue.enqueue("limits.work", queue="exports")
    jobqueue.enqueue("limits.work", uses={"api": 1})
    jobqueue.pause_resource("tenant:*")
    pausing.pause_queue("exports")
    listed = admin_client.get(url("job_changelist")).content.decode()
    assert listed.count('class="jq-paused"') == 2
    assert "paused: resource &#x27;tenant:*&#x27; is paused" in listed
    assert "paused: queue &#x27;exports&#x27; is paused" in listed
    assert held.pk and queued.pk


def test_a_finished_job_offers_no_pause() -> None:
    job = JobFactory(state=Job.State.DONE, finished_at=timezone.now())
    admin = login(make_user("pauser", "view_job", "pause_workflow"))
    assert "Pause workflow" not in admin.get(url("job_change", job.pk)).content.decode()
    response = admin.post(url("job_pause", job.pk), follow=True)
    assert messages_of(response) == [f"Nothing was paused: job #{job.pk} is done."]
    assert not PausedWorkflow.objects.exists()


@pytest.mark.parametrize("target", ["job_pause", "job_resume"])
def test_pausing_a_workflow_needs_its_own_permission(target: str) -> None:
    job = jobqueue.enqueue("limits.work")
    if target == "job_resume":
        jobqueue.pause_workflow(job)
    before = pausing.paused_workflows()
    page = url("job_change", job.pk)
    button = "Pause workflow" if target == "job_pause" else "Resume workflow"
    changer = login(make_user("changer", "view_job", "change_job", "pause_resource"))
    assert button not in changer.get(page).content.decode()
    assert changer.post(url(target, job.pk)).status_code == 403
    assert pausing.paused_workflows() == before
    allowed = login(make_user("allowed", "view_job", "pause_workflow"), enforce_csrf_checks=True)
    assert allowed.get(url(target, job.pk)).status_code == 405
    assert allowed.post(url(target, job.pk)).status_code == 403  # no CSRF token
    assert pausing.paused_workflows() == before
    assert button in allowed.get(page).content.decode()
    allowed.post(url(target, job.pk), {"csrfmiddlewaretoken": csrf_token(allowed, page)})
    assert pausing.paused_workflows() == (() if before else (job.pk,))
