"""The admin's view of long work: a workflow at a glance (children by state, a bar, the pace,
failed children made obvious), progress bars in the lists, and retry from a step."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.utils import timezone

import django_jobqueue as jobqueue
from django_jobqueue.exceptions import InvalidJobError
from django_jobqueue.models import Job, JobStep
from django_jobqueue.testing import run_jobs
from tests.support.admin_support import csrf_token, login, make_user, url
from tests.support.factories import JobFactory
from tests.testapp.durable_jobs import lines

pytestmark = pytest.mark.django_db


def workflow(children: dict[str, int]) -> Job:
    """A sealed container with children in the given states."""
    box = JobFactory(type="nightly", state=Job.State.WAITING, is_container=True, sealed=True)
    now = timezone.now()
    for state, count in children.items():
        final = state in Job.TERMINAL_STATES
        leased = state in Job.LEASED_STATES
        for _ in range(count):
            JobFactory(
                parent=box,
                state=state,
                attempts=1 if final or leased else 0,
                finished_at=now - dt.timedelta(seconds=30) if final else None,
                lease_owner="w" if leased else None,
                lease_expires=now + dt.timedelta(seconds=30) if leased else None,
            )
    return box


def test_a_workflow_page_counts_its_children_and_shows_a_failed_one(admin_client: Client) -> None:
    box = workflow({"done": 20, "dead": 1, "running": 2, "ready": 7})
    html = admin_client.get(url("job_change", box.pk)).content.decode()
    assert '<progress max="30" value="21"></progress> 21 of 30 children final (70%)' in html
    assert "1 of its children failed" in html
    assert f'?container={box.pk}&amp;state=failed">see them' in html
    assert f"?container={box.pk}&amp;state=dead" in html
    assert "21 children finished in the last 5 minutes" in html and "left at that pace" in html


def test_the_list_marks_a_workflow_with_a_dead_child(admin_client: Client) -> None:
    box = workflow({"done": 3, "dead": 1, "waiting": 2})
    html = admin_client.get(url("job_changelist")).content.decode()
    row = html.split(f'name="_selected_action" value="{box.pk}"')[1].split("</tr>")[0]
    assert "4 of 6 final" in row and '<span class="jq-warn">1 dead</span>' in row


def test_a_running_jobs_progress_is_a_bar_in_the_lists(admin_client: Client) -> None:
    job = JobFactory(
        state=Job.State.RUNNING,
        attempts=1,
        lease_owner="w",
        lease_expires=timezone.now() + dt.timedelta(seconds=30),
        started_at=timezone.now(),
        progress={"current": 38, "total": 40, "message": "page 38", "updated_at": None},
    )
    for page in ("job_changelist", "livelease_changelist"):
        html = admin_client.get(url(page)).content.decode()
        assert '<progress max="40" value="38" title="page 38"></progress> 38/40' in html, page
    assert job.pk


def dead_after_two_pages(tmp_path: Path) -> tuple[Job, str]:
    marker = str(tmp_path / "calls")
    job = jobqueue.enqueue(
        "durable.loop_steps", {"marker": marker, "pages": 4, "fail_at": 2}, max_attempts=1
    )
    run_jobs()
    job.refresh_from_db()
    assert job.state == Job.State.DEAD and lines(marker) == ["page0", "page1"]
    return job, marker


def test_retry_from_a_step_runs_the_steps_after_it_again(
    admin_client: Client, tmp_path: Path
) -> None:
    job, marker = dead_after_two_pages(tmp_path)
    first, second = JobStep.objects.filter(job=job).order_by("pk")
    page = admin_client.get(url("job_change", job.pk)).content.decode()
    assert "Retry from step" in page and f'value="{second.pk}" selected' in page
    response = admin_client.post(url("job_retry_step", job.pk), {"step": first.pk}, follow=True)
    assert "the steps after record" in response.content.decode()
    assert list(JobStep.objects.filter(job=job).values_list("pk", flat=True)) == [first.pk]
    run_jobs()
    job.refresh_from_db()
    assert job.state == Job.State.DONE
    assert lines(marker) == ["page0", "page1", "page1", "page2", "page3"]  # page0 was kept
    assert job.result[0] == {"page": 0, "items": [0, 1]}


def test_retry_from_an_unsaved_step_is_refused(tmp_path: Path) -> None:
    job, _ = dead_after_two_pages(tmp_path)
    with pytest.raises(InvalidJobError, match="not an unsaved JobStep"):
        jobqueue.retry(job, keep_steps_through=JobStep(job=job, name="page", attempt=1))
    job.refresh_from_db()
    assert job.state == Job.State.DEAD and JobStep.objects.filter(job=job).count() == 2


def test_retry_from_a_step_refuses_to_clear_a_spawn() -> None:
    job = JobFactory(state=Job.State.DEAD, attempts=1, max_attempts=1, has_steps=True,
                     finished_at=timezone.now())  # fmt: skip
    before = JobStep.objects.create(job=job, name="one", seq=1, attempt=1, result=1)
    JobStep.objects.create(job=job, name="@spawn", seq=1, attempt=1, result={"job_id": 99})
    with pytest.raises(InvalidJobError, match="spawn that child again"):
        jobqueue.retry(job, keep_steps_through=before)
    assert JobStep.objects.filter(job=job).count() == 2
    assert Job.objects.get(pk=job.pk).state == Job.State.DEAD
    with pytest.raises(InvalidJobError, match="no step record"):
        jobqueue.retry(job, keep_steps_through=10**9)


def test_retry_from_a_step_is_a_post_of_a_user_who_may_change_jobs(tmp_path: Path) -> None:
    job, _ = dead_after_two_pages(tmp_path)
    first = JobStep.objects.filter(job=job).order_by("pk").first()
    target = url("job_retry_step", job.pk)
    viewer = login(make_user("viewer", "view_job"))
    assert "Retry from step" not in viewer.get(url("job_change", job.pk)).content.decode()
    assert viewer.post(target, {"step": first.pk}).status_code == 403
    changer = login(make_user("changer", "change_job"), enforce_csrf_checks=True)
    assert changer.get(target).status_code == 405
    assert changer.post(target, {"step": first.pk}).status_code == 403  # no CSRF token
    token = csrf_token(changer, url("job_change", job.pk))
    changer.post(target, {"step": first.pk, "csrfmiddlewaretoken": token})
    assert Job.objects.get(pk=job.pk).state == Job.State.READY
    entries = LogEntry.objects.filter(object_id=str(job.pk), change_message__contains="steps")
    assert entries.get().user.username == "changer"


def test_retry_from_a_step_offers_the_latest_records_and_selects_the_last() -> None:
    from django_jobqueue.admin.durable import SHOWN_STEPS, START, retry_points

    job = JobFactory(state=Job.State.DEAD, attempts=1, finished_at=timezone.now(), has_steps=True)
    JobStep.objects.bulk_create(
        [JobStep(job=job, name="page", seq=n, attempt=1) for n in range(1, SHOWN_STEPS + 6)]
    )
    points = retry_points(job)
    ids = list(JobStep.objects.filter(job=job).order_by("pk").values_list("pk", flat=True))
    assert points[0][0] == START  # it spawned nothing: it may start over
    assert [int(value) for value, _, _ in points[1:]] == ids[5:]  # the latest 200, oldest first
    assert points[-1][1:] == (f"page #{SHOWN_STEPS + 5} (attempt 1)", True)


def test_a_suspended_jobs_page_shows_its_steps_and_what_it_waits_for(
    admin_client: Client,
) -> None:
    sleeper = jobqueue.enqueue("durable.sleeper", {"seconds": 3600})
    waiter = jobqueue.enqueue("durable.waiter", {"key": "approval:9", "timeout": 3600})
    parent = jobqueue.enqueue(
        "durable.spawn_and_wait", {"children": [["durable.waiter", {"key": "child:1"}]]}
    )
    run_jobs(ignore_delays=False)
    [child] = Job.objects.filter(parent_id=parent.pk)
    states = dict(Job.objects.values_list("pk", "state"))
    assert [states[j.pk] for j in (sleeper, waiter, parent)] == ["scheduled", "waiting", "waiting"]

    def waits_for(job: Job) -> str:
        page = admin_client.get(url("job_change", job.pk)).content.decode()
        return page.split("<label>Waits for:</label>")[1].split("</div>")[0]

    page = admin_client.get(url("job_change", sleeper.pk)).content.decode()
    steps = page.split("<label>Steps (durable calls kept across runs):</label>")[1]
    steps = steps.split("</table>")[0]
    assert "<th>step</th><th>call</th><th>place</th><th>attempt</th>" in steps
    assert "<td>started</td><td>1</td><td>1</td>" in steps and "<td>sleep</td>" in steps
    assert "its run after" in waits_for(sleeper)
    assert "event approval:9, gives up at" in waits_for(waiter)
    awaited = waits_for(parent)
    assert "jobs to be final:" in awaited and f">#{child.pk}</a>" in awaited


def test_a_mapping_jobs_page_shows_its_maps_progress(admin_client: Client) -> None:
    parent = jobqueue.enqueue(
        "map.parent", {"items": [1, 2, 3, 4, 5], "concurrency": 2, "options": {"queue": "kids"}}
    )
    run_jobs(queues="default")  # it spawns and suspends
    first = Job.objects.filter(parent_id=parent.pk).order_by("pk").first()
    assert first is not None
    jobqueue.cancel(first)  # one final: the next held child takes its place

    def field(label: str) -> str:
        page = admin_client.get(url("job_change", parent.pk)).content.decode()
        return page.split(f"<label>{label}:</label>")[1].split("</div>")[0]

    maps = field("Maps (ctx.map)")
    assert '<progress max="5" value="1"></progress> 1 / 5 children of map.square final' in maps
    assert "(2 running, at most 2 at once)" in maps
    assert "the children of its map (1 / 5 final)" in field("Waits for")
    run_jobs()
    assert "5 / 5 children of map.square final</p>" in field("Maps (ctx.map)")
