"""A replay that checks itself, in one process: each durable call's place is recorded, a replay
whose call at a recorded place differs raises ReplayMismatch and the job ends dead without a
retry, and retry(keep_places_through=...) runs the new code from the last place that agreed.
(Worker processes of two releases: tests/deploys/test_versions_workers.py.)"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

import django_jobqueue as jobqueue
from django_jobqueue import registry
from django_jobqueue.exceptions import InvalidJobError
from django_jobqueue.models import Job, JobStep
from django_jobqueue.testing import run_jobs

pytestmark = pytest.mark.django_db

KEY = "scratch.flow"
MISMATCH = "django_jobqueue.exceptions.ReplayMismatch"

Deploy = Callable[[Callable[..., Any]], None]


@pytest.fixture
def deploy() -> Iterator[Deploy]:
    """Register `func` as the code of KEY, in place of the code before (a deploy)."""

    def install(func: Callable[..., Any]) -> None:
        registry.unregister(KEY)
        jobqueue.handler(KEY, takes_context=True)(func)

    yield install
    registry.unregister(KEY)


def value(name: str) -> Callable[[], str]:
    return lambda: f"{name}-result"


def a_b_sleep(ctx: jobqueue.JobContext) -> list[str]:
    got = [ctx.step("a", value("a")), ctx.step("b", value("b"))]
    ctx.sleep(3600)
    return got


def b_a_sleep(ctx: jobqueue.JobContext) -> list[str]:
    got = [ctx.step("b", value("b")), ctx.step("a", value("a"))]
    ctx.sleep(3600)
    return got


def asleep(deploy: Deploy, code: Callable[..., Any], **options: Any) -> Job:
    """A job of `code` that ran until its sleep."""
    deploy(code)
    job = jobqueue.enqueue(KEY, **options)
    run_jobs(ignore_delays=False)
    job.refresh_from_db()
    assert job.state == Job.State.SCHEDULED
    return job


def places(job: Job) -> list[tuple[int | None, str, int]]:
    rows = JobStep.objects.filter(job=job).order_by("pk")
    return list(rows.values_list("place", "name", "seq"))


def test_each_durable_call_records_its_place(deploy):
    job = asleep(deploy, a_b_sleep)
    assert places(job) == [(1, "a", 1), (2, "b", 1), (3, "@sleep", 1)]
    run_jobs()  # the same code: it replays and ends
    job.refresh_from_db()
    assert (job.state, job.result) == ("done", ["a-result", "b-result"])


def test_a_replay_that_asks_another_call_at_a_place_ends_dead_without_retry(deploy):
    job = asleep(deploy, a_b_sleep, max_attempts=5)
    deploy(b_a_sleep)  # deployed in place: b before a
    report = run_jobs()  # no exception: the job ends dead, as under a worker
    job.refresh_from_db()
    assert report.attempts == 1
    assert (job.state, job.attempts) == ("dead", 1)
    error = job.last_error
    assert error["type"] == MISMATCH and error["place"] == 1
    assert f"job {job.pk} does not replay as it ran" in error["message"]
    assert (
        "at place 1 its handler asks for step 'b', where step 'a' was recorded"
        in (error["message"])
    )
    # Retried from place 0: the new code runs from the start.
    jobqueue.retry(job, keep_places_through=0)
    assert places(job) == []
    run_jobs()
    job.refresh_from_db()
    assert (job.state, job.result) == ("done", ["b-result", "a-result"])
    assert places(job) == [(1, "b", 1), (2, "a", 1)]  # run_jobs(): sleeps return at once


def test_another_kind_of_call_at_a_place_is_a_mismatch(deploy):
    job = asleep(deploy, a_b_sleep)

    def sleeps_first(ctx: jobqueue.JobContext) -> None:
        ctx.step("a", value("a"))
        ctx.sleep(3600)

    deploy(sleeps_first)
    run_jobs()
    job.refresh_from_db()
    assert job.state == "dead"
    assert (
        "at place 2 its handler asks for a sleep, where step 'b' was recorded"
        in (job.last_error["message"])
    )


def test_a_handler_that_catches_the_mismatch_still_ends_dead(deploy):
    job = asleep(deploy, a_b_sleep)

    def swallows(ctx: jobqueue.JobContext) -> str:
        with contextlib.suppress(jobqueue.ReplayMismatch):
            ctx.step("x", value("x"))
        try:
            ctx.step("a", value("a"))  # the run goes no further: raised again
        except Exception as exc:
            return f"went on after {type(exc).__name__}"
        return "went on"

    deploy(swallows)
    run_jobs()
    job.refresh_from_db()
    assert (job.state, job.result, job.last_error["type"]) == ("dead", None, MISMATCH)


def test_a_change_after_the_last_recorded_place_replays_fine(deploy):
    job = asleep(deploy, a_b_sleep)

    def more_after(ctx: jobqueue.JobContext) -> list[str]:
        got = a_b_sleep(ctx)
        return [*got, ctx.step("c", value("c"))]

    deploy(more_after)
    run_jobs()
    job.refresh_from_db()
    assert (job.state, job.result) == ("done", ["a-result", "b-result", "c-result"])


def test_records_without_places_are_matched_by_name_and_call_as_before(deploy):
    deploy(b_a_sleep)
    job = jobqueue.enqueue(KEY)
    Job.objects.filter(pk=job.pk).update(has_steps=True, first_started_at=job.created_at)
    for name in ("a", "b", "@sleep"):  # written by a release before places, in another order
        result = None if name == "@sleep" else f"old-{name}"
        JobStep.objects.create(job=job, name=name, seq=1, result=result, attempt=1)
    run_jobs()
    job.refresh_from_db()
    assert (job.state, job.result) == ("done", ["old-b", "old-a"])


def test_a_record_found_at_another_place_is_a_mismatch(deploy):
    calls: list[str] = []

    def flaky_a(ctx: jobqueue.JobContext) -> list[Any]:
        got: list[Any] = []
        try:
            got.append(ctx.step("a", fail_once))  # fails on the first run, caught
        except RuntimeError:
            got.append(None)
        got.append(ctx.step("b", value("b")))
        ctx.sleep(3600)
        return got

    def fail_once() -> str:
        calls.append("a")
        if len(calls) == 1:
            raise RuntimeError("not yet")
        return "a-result"

    job = asleep(deploy, flaky_a)
    assert places(job) == [(2, "b", 1), (3, "@sleep", 1)]  # place 1 recorded nothing

    def b_first(ctx: jobqueue.JobContext) -> None:
        ctx.step("b", value("b"))

    deploy(b_first)
    run_jobs()
    job.refresh_from_db()
    assert (
        "at place 1 its handler asks for step 'b', where nothing (its record is at place "
        in (job.last_error["message"])
    )


def test_the_same_code_fills_a_place_that_recorded_nothing(deploy):
    calls: list[str] = []

    def fail_once() -> str:
        calls.append("a")
        if len(calls) == 1:
            raise RuntimeError("not yet")
        return "a-result"

    def flaky_a(ctx: jobqueue.JobContext) -> list[Any]:
        try:
            got = [ctx.step("a", fail_once)]
        except RuntimeError:
            got = [None]
        got.append(ctx.step("b", value("b")))
        ctx.sleep(3600)
        return got

    job = asleep(deploy, flaky_a)
    run_jobs()
    job.refresh_from_db()
    assert (job.state, job.result) == ("done", ["a-result", "b-result"])
    assert sorted(places(job)) == [(1, "a", 1), (2, "b", 1), (3, "@sleep", 1)]


def test_an_async_handler_checks_its_replay_too(deploy):
    async def a_b(ctx: jobqueue.AsyncJobContext) -> list[str]:
        got = [await ctx.step("a", value("a")), await ctx.step("b", value("b"))]
        await ctx.sleep(3600)
        return got

    async def b_a(ctx: jobqueue.AsyncJobContext) -> list[str]:
        got = [await ctx.step("b", value("b")), await ctx.step("a", value("a"))]
        await ctx.sleep(3600)
        return got

    job = asleep(deploy, a_b)
    deploy(b_a)
    run_jobs()
    job.refresh_from_db()
    assert (job.state, job.last_error["place"]) == ("dead", 1)
    jobqueue.retry(job, keep_places_through=0)
    run_jobs()
    job.refresh_from_db()
    assert (job.state, job.result) == ("done", ["b-result", "a-result"])


# -- retry from a place ---------------------------------------------------------------------------


def test_retry_keeps_the_records_through_a_place(deploy):
    job = asleep(deploy, a_b_sleep)
    Job.objects.filter(pk=job.pk).update(state="dead", finished_at=job.created_at)
    jobqueue.retry(job, keep_places_through=1)
    assert places(job) == [(1, "a", 1)]


@pytest.mark.parametrize("bad", [-1, True, 1.0, "0", 2**31])
def test_retry_refuses_a_bad_place(deploy, bad):
    job = asleep(deploy, a_b_sleep)
    with pytest.raises(InvalidJobError, match="keep_places_through must be a place"):
        jobqueue.retry(job, keep_places_through=bad)


def test_retry_takes_a_step_or_a_place_not_both(deploy):
    job = asleep(deploy, a_b_sleep)
    with pytest.raises(InvalidJobError, match="keep_steps_through or keep_places_through"):
        jobqueue.retry(job, keep_steps_through=1, keep_places_through=0)


def test_retry_from_a_place_refuses_to_clear_a_spawn(deploy):
    def spawner(ctx: jobqueue.JobContext) -> None:
        ctx.step("a", value("a"))
        ctx.spawn("test.noop")
        ctx.sleep(3600)

    job = asleep(deploy, spawner)
    Job.objects.filter(pk=job.pk).update(state="dead", finished_at=job.created_at)
    with pytest.raises(InvalidJobError, match="spawn that child again"):
        jobqueue.retry(job, keep_places_through=1)
    jobqueue.retry(job, keep_places_through=2)
    assert [p for p, _, _ in places(job)] == [1, 2]


def test_the_admin_offers_the_retry_at_the_last_place_that_agreed(admin_client: Client, deploy):
    def a_b_c(ctx: jobqueue.JobContext) -> None:
        for name in ("a", "b", "c"):
            ctx.step(name, value(name))
        ctx.sleep(3600)

    def a_b_x(ctx: jobqueue.JobContext) -> str:
        for name in ("a", "b", "x"):
            ctx.step(name, value(name))
        return "new"

    job = asleep(deploy, a_b_c)
    deploy(a_b_x)
    run_jobs()
    job.refresh_from_db()
    assert (job.state, job.last_error["place"]) == ("dead", 3)
    page = admin_client.get(reverse("admin:django_jobqueue_job_change", args=[job.pk]))
    html = page.content.decode()
    b = JobStep.objects.get(job=job, name="b")
    assert f'<option value="{b.pk}" selected>place 2: b #1 (attempt 1)</option>' in html
    assert '<option value="start">nothing: run from the start</option>' in html
    url = reverse("admin:django_jobqueue_job_retry_step", args=[job.pk])
    response = admin_client.post(url, {"step": b.pk}, follow=True)
    assert "the steps after record" in response.content.decode()
    assert places(job) == [(1, "a", 1), (2, "b", 1)]
    run_jobs()
    job.refresh_from_db()
    assert (job.state, job.result) == ("done", "new")


def test_the_admin_retries_from_the_start(admin_client: Client, deploy):
    job = asleep(deploy, a_b_sleep)
    deploy(b_a_sleep)
    run_jobs()
    page = admin_client.get(reverse("admin:django_jobqueue_job_change", args=[job.pk]))
    assert '<option value="start" selected>nothing: run from the start</option>' in (
        page.content.decode()
    )
    url = reverse("admin:django_jobqueue_job_retry_step", args=[job.pk])
    response = admin_client.post(url, {"step": "start"}, follow=True)
    assert "every step runs again" in response.content.decode()
    assert places(job) == []
    assert Job.objects.get(pk=job.pk).state == "ready"
