"""ctx.patched(), in one process: True in a run of a job that had not reached the call when the
patch was deployed (recorded, at its place), False in a replay of one that had passed it, the
same answer on every later run. (Worker processes of two releases:
tests/deploys/test_versions_workers.py.)"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import django_jobqueue as jobqueue
from django_jobqueue import registry
from django_jobqueue.models import Job, JobStep
from django_jobqueue.testing import run_jobs

pytestmark = pytest.mark.django_db

KEY = "scratch.patched"

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


def asleep(deploy: Deploy, code: Callable[..., Any]) -> Job:
    """A job of `code` that ran until its sleep."""
    deploy(code)
    job = jobqueue.enqueue(KEY)
    run_jobs(ignore_delays=False)
    job.refresh_from_db()
    assert job.state == Job.State.SCHEDULED
    return job


def finish(job: Job) -> Job:
    run_jobs()
    job.refresh_from_db()
    assert job.state == Job.State.DONE, job.last_error
    return job


def records(job: Job) -> list[tuple[int | None, str]]:
    rows = JobStep.objects.filter(job=job).order_by("place", "pk")
    return list(rows.values_list("place", "name"))


def old_code(ctx: jobqueue.JobContext) -> list[Any]:
    a = ctx.step("a", value("a"))  # the point
    ctx.sleep(3600)
    return ["old", a]


def new_code(ctx: jobqueue.JobContext) -> list[Any]:
    took = ctx.patched("x")  # added before the point
    a = ctx.step("a", value("a-new" if took else "a"))
    ctx.sleep(3600)
    return [took, a]


def test_a_job_that_had_passed_the_point_gets_false(deploy):
    job = asleep(deploy, old_code)
    deploy(new_code)
    assert finish(job).result == [False, "a-result"]
    assert records(job) == [(1, "a"), (2, "@sleep")]  # False is not recorded: no place


def test_a_new_job_gets_true_recorded_and_again_on_every_later_run(deploy):
    deploy(new_code)
    job = asleep(deploy, new_code)
    assert records(job) == [(1, "@patch"), (2, "a"), (3, "@sleep")]
    assert JobStep.objects.get(job=job, name="@patch").result == {"patch": "x"}
    assert finish(job).result == [True, "a-new-result"]


def test_a_job_that_had_not_reached_the_point_gets_true(deploy):
    def sleeps_first(ctx: jobqueue.JobContext) -> list[Any]:
        ctx.sleep(3600)
        return ["old", ctx.step("a", value("a"))]

    def patched_after_the_sleep(ctx: jobqueue.JobContext) -> list[Any]:
        ctx.sleep(3600)
        took = ctx.patched("x")
        return [took, ctx.step("a", value("a"))]

    job = asleep(deploy, sleeps_first)
    deploy(patched_after_the_sleep)
    assert finish(job).result == [True, "a-result"]
    assert records(job) == [(1, "@sleep"), (2, "@patch"), (3, "a")]


def test_the_first_call_of_an_id_in_a_run_decides_for_the_whole_job(deploy):
    def loop_old(ctx: jobqueue.JobContext) -> list[Any]:
        got = [ctx.step("page", value("old")) for _ in range(2)]
        ctx.sleep(3600)
        return got + [ctx.step("page", value("old")) for _ in range(2)]

    def loop_new(ctx: jobqueue.JobContext) -> list[Any]:
        got = []
        for n in range(4):
            if n == 2:
                ctx.sleep(3600)
            got.append(ctx.step("page", value("new" if ctx.patched("pages") else "old")))
        return got

    old = asleep(deploy, loop_old)
    deploy(loop_new)
    # False all along: also past the records of the old code (one answer for the job).
    assert finish(old).result == ["old-result"] * 4
    fresh = asleep(deploy, loop_new)
    assert [name for _, name in records(fresh)].count("@patch") == 1
    assert finish(fresh).result == ["new-result"] * 4


def test_a_patch_taken_out_once_every_job_took_its_new_path_is_passed_over(deploy):
    job = asleep(deploy, new_code)

    def cleaned_up(ctx: jobqueue.JobContext) -> list[Any]:
        a = ctx.step("a", value("a-new"))  # the patched() call and the old path removed
        ctx.sleep(3600)
        return ["clean", a]

    deploy(cleaned_up)
    assert finish(job).result == ["clean", "a-new-result"]


def test_two_patches_one_after_the_other(deploy):
    def first_patch(ctx: jobqueue.JobContext) -> list[Any]:
        x = ctx.patched("x")
        ctx.step("a", value("a"))
        ctx.sleep(3600)
        return [x]

    def second_patch(ctx: jobqueue.JobContext) -> list[Any]:
        x = ctx.patched("x")
        y = ctx.patched("y")  # added in the release after, before the same point
        ctx.step("a", value("a"))
        ctx.sleep(3600)
        return [x, y]

    under_x = asleep(deploy, first_patch)
    deploy(second_patch)
    assert finish(under_x).result == [True, False]
    fresh = asleep(deploy, second_patch)
    assert finish(fresh).result == [True, True]


def test_records_from_before_places_count_as_passed_until_replayed(deploy):
    deploy(new_code)
    job = jobqueue.enqueue(KEY)
    Job.objects.filter(pk=job.pk).update(has_steps=True, first_started_at=job.created_at)
    for name in ("a", "@sleep"):  # no place: written by a release before them
        JobStep.objects.create(job=job, name=name, seq=1, result=f"old-{name}", attempt=1)
    assert finish(job).result == [False, "old-a"]


@pytest.mark.parametrize("bad", ["", "\n", 7, "x" * 201])
def test_a_bad_patch_id_is_refused(deploy, bad):
    def bad_patch(ctx: jobqueue.JobContext) -> None:
        ctx.patched(bad)

    deploy(bad_patch)
    job = jobqueue.enqueue(KEY)
    run_jobs()
    job.refresh_from_db()
    assert job.state == "dead" and "patch id" in job.last_error["message"]
    assert records(job) == []


def test_an_async_handler_awaits_patched(deploy):
    async def async_old(ctx: jobqueue.AsyncJobContext) -> list[Any]:
        a = await ctx.step("a", value("a"))
        await ctx.sleep(3600)
        return ["old", a]

    async def async_new(ctx: jobqueue.AsyncJobContext) -> list[Any]:
        took = await ctx.patched("x")
        a = await ctx.step("a", value("a"))
        await ctx.sleep(3600)
        return [took, a]

    old = asleep(deploy, async_old)
    deploy(async_new)
    assert finish(old).result == [False, "a-result"]
    fresh = asleep(deploy, async_new)
    assert finish(fresh).result == [True, "a-result"]


def test_patched_after_a_mismatch_raises_it_again(deploy):
    job = asleep(deploy, old_code)

    def mismatched(ctx: jobqueue.JobContext) -> Any:
        try:
            ctx.step("b", value("b"))
        except jobqueue.ReplayMismatch:
            return ctx.patched("z")
        return None

    deploy(mismatched)
    run_jobs()
    job.refresh_from_db()
    assert (job.state, job.last_error["type"]) == (
        "dead",
        "django_jobqueue.exceptions.ReplayMismatch",
    )
