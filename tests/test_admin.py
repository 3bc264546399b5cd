"""The admin shows jobs and workers read-only to a superuser."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.contrib import admin
from django.urls import reverse
from django.utils import timezone

from django_jobqueue.admin import JobAdmin, WorkerAdmin
from django_jobqueue.models import Job, JobDependency, Worker
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fast_password_hashing(settings: Any) -> None:
    """The admin_user fixture hashes a password per test: use a cheap hasher."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def jobs() -> list[Job]:
    now = timezone.now()
    return [
        JobFactory(args={"a": 1}, group_key="batch-1"),
        JobFactory(
            state=Job.State.DEAD,
            attempts=3,
            finished_at=now,
            last_error={
                "type": "builtins.RuntimeError",
                "message": "boom <b>",
                "traceback": "Traceback (most recent call last):\n  RuntimeError: boom",
            },
        ),
        JobFactory(state=Job.State.DONE, finished_at=now, result={"total": 3}),
        JobFactory(
            state=Job.State.RUNNING,
            lease_owner="host:1:abc",
            lease_expires=now + dt.timedelta(seconds=30),
            queue="emails",
        ),
    ]


@pytest.fixture
def worker() -> Worker:
    now = timezone.now()
    return Worker.objects.create(
        id="host:123:abcdef",
        host="host",
        pid=123,
        queues=["default", "emails"],
        concurrency=4,
        started_at=now,
        heartbeat_at=now,
    )


def test_models_are_registered() -> None:
    assert isinstance(admin.site._registry[Job], JobAdmin)
    assert isinstance(admin.site._registry[Worker], WorkerAdmin)
    assert JobDependency not in admin.site._registry


def test_job_changelist(admin_client: Any, jobs: list[Job]) -> None:
    response = admin_client.get(reverse("admin:django_jobqueue_job_changelist"))
    assert response.status_code == 200
    content = response.content.decode()
    assert "4 jobs" in content
    for job in jobs:
        assert reverse("admin:django_jobqueue_job_change", args=[job.pk]) in content
    # No "add" button, no bulk delete action.
    assert reverse("admin:django_jobqueue_job_add") not in content
    assert "delete_selected" not in content


@pytest.mark.parametrize(
    "query",
    [
        "state__exact=dead",
        "queue__exact=emails",
        "type__exact=test.noop",
        "q=batch-1",
        "q=test",
        "o=-1",
        "created_at__year=2020",
    ],
)
def test_job_changelist_filters_search_and_sorting(
    admin_client: Any, jobs: list[Job], query: str
) -> None:
    response = admin_client.get(reverse("admin:django_jobqueue_job_changelist") + "?" + query)
    assert response.status_code == 200


def test_job_search_by_id(admin_client: Any, jobs: list[Job]) -> None:
    url = reverse("admin:django_jobqueue_job_changelist")
    response = admin_client.get(url, {"q": str(jobs[1].pk)})
    assert response.status_code == 200
    assert response.context["cl"].result_count == 1


def test_job_detail_page(admin_client: Any, jobs: list[Job]) -> None:
    dead = jobs[1]
    response = admin_client.get(reverse("admin:django_jobqueue_job_change", args=[dead.pk]))
    assert response.status_code == 200
    content = response.content.decode()
    assert "builtins.RuntimeError: boom &lt;b&gt;" in content  # escaped
    assert "RuntimeError: boom" in content
    assert 'name="_save"' not in content  # read-only: no save button


@pytest.mark.parametrize("index", [0, 2, 3])
def test_other_job_detail_pages(admin_client: Any, jobs: list[Job], index: int) -> None:
    url = reverse("admin:django_jobqueue_job_change", args=[jobs[index].pk])
    assert admin_client.get(url).status_code == 200


def test_worker_changelist(admin_client: Any, worker: Worker) -> None:
    response = admin_client.get(reverse("admin:django_jobqueue_worker_changelist"))
    assert response.status_code == 200
    content = response.content.decode()
    assert worker.id in content
    assert reverse("admin:django_jobqueue_worker_add") not in content


def test_worker_detail_page(admin_client: Any, worker: Worker) -> None:
    url = reverse("admin:django_jobqueue_worker_change", args=[worker.pk])
    assert admin_client.get(url).status_code == 200


def test_adding_is_forbidden(admin_client: Any) -> None:
    for model in ("job", "worker"):
        url = reverse(f"admin:django_jobqueue_{model}_add")
        assert admin_client.get(url).status_code == 403
        assert admin_client.post(url, {}).status_code == 403
    assert not Job.objects.exists() and not Worker.objects.exists()


def test_deleting_is_forbidden(admin_client: Any, jobs: list[Job], worker: Worker) -> None:
    job_url = reverse("admin:django_jobqueue_job_delete", args=[jobs[0].pk])
    assert admin_client.get(job_url).status_code == 403
    assert admin_client.post(job_url, {"post": "yes"}).status_code == 403
    worker_url = reverse("admin:django_jobqueue_worker_delete", args=[worker.pk])
    assert admin_client.post(worker_url, {"post": "yes"}).status_code == 403
    assert Job.objects.filter(pk=jobs[0].pk).exists()
    assert Worker.objects.filter(pk=worker.pk).exists()


def test_changing_is_forbidden(admin_client: Any, jobs: list[Job]) -> None:
    job = jobs[0]
    url = reverse("admin:django_jobqueue_job_change", args=[job.pk])
    response = admin_client.post(url, {"type": "test.add", "state": "dead", "priority": 9})
    assert response.status_code == 403
    job.refresh_from_db()
    assert (job.type, job.state, job.priority) == ("test.noop", "ready", 0)


def test_bulk_delete_action_is_not_offered(admin_client: Any, jobs: list[Job]) -> None:
    url = reverse("admin:django_jobqueue_job_changelist")
    response = admin_client.post(
        url, {"action": "delete_selected", "_selected_action": [j.pk for j in jobs], "post": "yes"}
    )
    assert response.status_code in (200, 302, 403)
    assert Job.objects.count() == len(jobs)


def test_anonymous_users_are_sent_to_login(client: Any) -> None:
    response = client.get(reverse("admin:django_jobqueue_job_changelist"))
    assert response.status_code == 302
    assert "/login/" in response["Location"]
