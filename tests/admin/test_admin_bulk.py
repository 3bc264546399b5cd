"""Actions over a whole filtered list ("select all"): a confirmation page with the count, the
work in the request up to ACTION_LIMIT jobs, and beyond it a job of the queue that goes through
the list in batches, as the operator who asked."""

from __future__ import annotations

import re

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone

from django_jobqueue.admin import actions, bulk
from django_jobqueue.models import Job
from django_jobqueue.testing import run_jobs
from tests.support.admin_support import url
from tests.support.factories import JobFactory

pytestmark = pytest.mark.django_db

LIMIT = 10  # ACTION_LIMIT for these tests: a few dozen jobs are "more than a request does"


@pytest.fixture(autouse=True)
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(actions, "ACTION_LIMIT", LIMIT)
    monkeypatch.setattr(bulk, "ACTION_LIMIT", LIMIT)


def dead_jobs(count: int, queue: str) -> list[Job]:
    return [
        JobFactory(state=Job.State.DEAD, attempts=1, queue=queue, finished_at=timezone.now())
        for _ in range(count)
    ]


def select_all(client: Client, page: str, action: str, ids: list[int], **extra: str):
    data = {
        "action": action,
        "index": "0",
        "select_across": "1",
        "_selected_action": [str(pk) for pk in ids],
        "extra_attempts": "2",
        **extra,
    }
    return client.post(page, data)


def test_select_all_asks_first_and_gives_the_count(admin_client: Client) -> None:
    matching = dead_jobs(25, "emails")
    other = dead_jobs(3, "reports")
    page = url("deadjob_changelist") + "?queue=emails"
    response = select_all(admin_client, page, "retry_jobs", [j.pk for j in matching[:5]])
    assert response.status_code == 200
    html = response.content.decode()
    assert re.search(r'class="jq-bulk-count">25<', html)
    assert "<code>queue</code> = <code>emails</code>" in html
    assert "batches of 10" in html
    assert 'name="jq_bulk_confirmed" value="yes"' in html
    assert 'name="select_across" value="1"' in html
    # Nothing was touched, and nothing was enqueued.
    assert Job.objects.filter(state=Job.State.DEAD).count() == 28
    assert not Job.objects.filter(type=bulk.BULK_HANDLER).exists()
    assert {j.state for j in Job.objects.filter(pk__in=[o.pk for o in other])} == {"dead"}


def test_a_confirmed_small_set_is_handled_in_the_request(admin_client: Client) -> None:
    matching = dead_jobs(LIMIT, "emails")
    dead_jobs(2, "reports")
    page = url("deadjob_changelist") + "?queue=emails"
    response = select_all(
        admin_client, page, "retry_jobs", [matching[0].pk], jq_bulk_confirmed="yes"
    )
    assert response.status_code == 302
    assert not Job.objects.filter(queue="emails", state=Job.State.DEAD).exists()
    assert Job.objects.filter(queue="reports", state=Job.State.DEAD).count() == 2
    assert not Job.objects.filter(type=bulk.BULK_HANDLER).exists()


def test_a_large_set_goes_to_a_job_that_works_in_batches(admin_client: Client) -> None:
    matching = dead_jobs(3 * LIMIT + 5, "emails")
    dead_jobs(4, "reports")
    page = url("deadjob_changelist") + "?queue=emails"
    response = select_all(
        admin_client, page, "retry_jobs", [matching[0].pk], jq_bulk_confirmed="yes"
    )
    assert response.status_code == 302
    worker_job = Job.objects.get(type=bulk.BULK_HANDLER)
    followed = admin_client.get(response["Location"]).content.decode()
    assert "35 matching jobs are handed to job" in followed
    assert url("job_change", worker_job.pk) in followed
    # Nothing is done in the request.
    assert Job.objects.filter(queue="emails", state=Job.State.DEAD).count() == 35

    report = run_jobs(queues=["default"])
    assert [j.pk for j in report.jobs] == [worker_job.pk]
    worker_job.refresh_from_db()
    assert worker_job.state == Job.State.DONE, worker_job.last_error
    assert worker_job.result == {"matched": 35, "changed": 35, "skipped": 0}
    assert worker_job.progress["current"] == 35
    assert not Job.objects.filter(queue="emails", state=Job.State.DEAD).exists()
    retried = Job.objects.filter(queue="emails")
    assert {j.max_attempts - j.attempts for j in retried} == {2}  # the extra attempts asked for
    assert Job.objects.filter(queue="reports", state=Job.State.DEAD).count() == 4
    # Each job's history names the operator, as a click does.
    entries = LogEntry.objects.filter(object_id__in=[str(j.pk) for j in matching])
    assert entries.count() == 35
    assert {e.user.username for e in entries} == {"admin"}


def test_a_bulk_job_of_an_operator_who_lost_the_permission_changes_nothing() -> None:
    staff = User.objects.create_user("ops", password="pw", is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(codename__in=["view_job", "change_job"]))
    client = Client()
    client.force_login(staff)
    matching = dead_jobs(2 * LIMIT, "emails")
    page = url("deadjob_changelist")
    select_all(client, page, "retry_jobs", [matching[0].pk], jq_bulk_confirmed="yes")
    worker_job = Job.objects.get(type=bulk.BULK_HANDLER)
    staff.user_permissions.remove(*Permission.objects.filter(codename="change_job"))
    run_jobs(queues=["default"])
    worker_job.refresh_from_db()
    assert worker_job.state == Job.State.DEAD
    assert "may no longer run" in worker_job.last_error["message"]
    assert Job.objects.filter(queue="emails", state=Job.State.DEAD).count() == 2 * LIMIT


def test_delete_and_cancel_by_filter(admin_client: Client) -> None:
    finished = [
        JobFactory(state=Job.State.DONE, queue="emails", finished_at=timezone.now())
        for _ in range(2 * LIMIT)
    ]
    unfinished = [JobFactory(queue="emails") for _ in range(2 * LIMIT)]
    jobs_page = url("job_changelist") + "?queue=emails"
    select_all(
        admin_client, jobs_page + "&state=done", "delete_finished_jobs", [finished[0].pk],
        jq_bulk_confirmed="yes",
    )  # fmt: skip
    select_all(
        admin_client, jobs_page + "&state=ready", "cancel_jobs", [unfinished[0].pk],
        jq_bulk_confirmed="yes",
    )  # fmt: skip
    assert Job.objects.filter(type=bulk.BULK_HANDLER).count() == 2
    run_jobs(queues=["default"])
    assert not Job.objects.filter(pk__in=[j.pk for j in finished]).exists()
    states = set(
        Job.objects.filter(pk__in=[j.pk for j in unfinished]).values_list("state", flat=True)
    )
    assert states == {Job.State.CANCELLED}
    assert set(Job.objects.filter(type=bulk.BULK_HANDLER).values_list("state", flat=True)) == {
        Job.State.DONE
    }


def test_select_all_says_what_the_capped_count_knows(admin_client: Client) -> None:
    now = timezone.now()
    Job.objects.bulk_create(
        [
            Job(type="test.noop", state=Job.State.DEAD, attempts=1, finished_at=now, args={})
            for _ in range(320)
        ]
    )
    html = admin_client.get(url("deadjob_changelist")).content.decode()
    assert "Select all 300+ dead jobs matching the filters" in html
    html = admin_client.get(url("deadjob_changelist") + "?p=2").content.decode()
    assert "Select all 320 dead jobs matching the filters" in html
