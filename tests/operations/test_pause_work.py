"""Pause a resource or a workflow: pause_resource / pause_workflow and their commands, and
workers that start none of the held jobs while running ones finish."""

from __future__ import annotations

import json
import time
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

import django_jobqueue as jobqueue
from django_jobqueue import pausing
from django_jobqueue.exceptions import InvalidJobError
from django_jobqueue.models import Job, PausedResource, PausedWorkflow, QueueState
from tests.conftest import assert_clean_log, poll, wait_for_job
from tests.support.factories import JobFactory
from tests.support.workflow_support import FAST, run_burst

pytestmark = pytest.mark.django_db(transaction=True)

LIMITS = {"tenant:*": {"concurrency": 5}, "openai": {"concurrency": 5}}


@pytest.fixture
def limits(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "LIMITS": LIMITS}


def command(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def ready_untouched(*jobs: Job) -> bool:
    rows = set(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("state", "attempts"))
    return rows == {("ready", 0)}


def test_pause_resource_records_it_and_says_what_changed():
    assert jobqueue.pause_resource("tenant:42") is True
    assert jobqueue.pause_resource("tenant:42") is False
    assert jobqueue.pause_resource("tenant:*") is True
    assert pausing.paused_resources() == ("tenant:*", "tenant:42")
    assert jobqueue.resume_resource("tenant:42") is True
    assert jobqueue.resume_resource("tenant:42") is False
    assert pausing.paused_resources() == ("tenant:*",)


@pytest.mark.parametrize("name", ["", "x" * 256, "tenant:4*2", "a\x00b", 42])
def test_a_bad_resource_name_is_refused_before_anything_is_written(name):
    with pytest.raises(InvalidJobError, match="resource"):
        jobqueue.pause_resource(name)
    with pytest.raises(InvalidJobError, match="resource"):
        jobqueue.resume_resource(name)
    assert not PausedResource.objects.exists()


def test_pause_workflow_takes_a_job_or_its_id_and_refuses_an_unknown_one():
    job = jobqueue.enqueue("test.noop")
    assert jobqueue.pause_workflow(job) is True
    assert jobqueue.pause_workflow(job.pk) is False
    assert pausing.paused_workflows() == (job.pk,)
    for bad in (job.pk + 1000, 0, -1, True, "1", 2**70):
        with pytest.raises(InvalidJobError):
            jobqueue.pause_workflow(bad)
        with pytest.raises(InvalidJobError):
            jobqueue.resume_workflow(bad)
    assert jobqueue.resume_workflow(job) is True
    assert jobqueue.resume_workflow(job) is False
    assert not PausedWorkflow.objects.exists()


def test_commands_pause_and_resume_resources_workflows_and_queues():
    job = jobqueue.enqueue("test.noop")
    assert command("jobqueue_pause", "q1", "--resource", "tenant:*", "--workflow", str(job.pk)) == (
        f"Paused queue 'q1'.\nPaused resource 'tenant:*'.\nPaused workflow #{job.pk}.\n"
    )
    assert command("jobqueue_pause", "--resource", "tenant:*") == (
        "Resource 'tenant:*' was paused already.\n"
    )
    assert command("jobqueue_resume", "--workflow", str(job.pk), "--resource", "openai") == (
        f"Resource 'openai' was not paused.\nResumed workflow #{job.pk}.\n"
    )
    assert command("jobqueue_resume", "q1", "--resource", "tenant:*") == (
        "Resumed queue 'q1'.\nResumed resource 'tenant:*'.\n"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["ok", "--workflow", "999999"],
        ["ok", "--workflow", "abc"],
        ["ok", "--workflow", "0"],
        ["ok", "--resource", "tenant:4*2"],
        ["ok", "--resource", ""],
        [],
    ],
)
@pytest.mark.parametrize("verb", ["jobqueue_pause", "jobqueue_resume"])
def test_a_bad_target_makes_the_command_write_nothing(verb, argv):
    with pytest.raises(CommandError):
        call_command(verb, *argv, stdout=StringIO())
    assert not QueueState.objects.exists()
    assert not PausedResource.objects.exists()
    assert not PausedWorkflow.objects.exists()


def test_a_paused_resource_holds_every_job_that_uses_it_until_resumed(limits):
    jobqueue.pause_resource("tenant:42")
    held = [
        jobqueue.enqueue("test.noop", uses={"tenant:42": 1}),
        # any paused resource holds a job that uses several
        jobqueue.enqueue("test.noop", uses={"openai": 1, "tenant:42": 1}),
    ]
    free = [
        jobqueue.enqueue("test.noop", uses={"tenant:43": 1}),
        jobqueue.enqueue("test.noop", uses={"openai": 1}),
        jobqueue.enqueue("test.noop"),
    ]
    assert run_burst() == 0
    assert {wait_for_job(j.pk, "done").state for j in free} == {"done"}
    assert ready_untouched(*held)
    jobqueue.resume_resource("tenant:42")
    assert run_burst() == 0
    assert {wait_for_job(j.pk, "done").state for j in held} == {"done"}


def test_a_paused_pattern_holds_its_whole_family_and_groups_and_queues(limits):
    jobqueue.pause_resource("tenant:*")
    jobqueue.pause_resource("group:acme")
    jobqueue.pause_resource("group:*")  # every job of a group, not those of none
    jobqueue.pause_resource("queue:slow*")
    held = [
        jobqueue.enqueue("test.noop", uses={"tenant:1": 1}),
        jobqueue.enqueue("test.noop", uses={"openai": 1, "tenant:2": 1}),
        jobqueue.enqueue("test.noop", group="acme"),
        jobqueue.enqueue("test.noop", queue="slow-lane"),
    ]
    beta = jobqueue.enqueue("test.noop", group="beta")
    free = [
        jobqueue.enqueue("test.noop", uses={"openai": 1}),
        jobqueue.enqueue("test.noop"),
    ]
    assert run_burst() == 0
    assert {wait_for_job(j.pk, "done").state for j in free} == {"done"}
    assert ready_untouched(*held, beta)
    jobqueue.resume_resource("group:*")
    assert run_burst() == 0
    assert wait_for_job(beta.pk, "done")
    assert ready_untouched(*held)
    reasons = {pausing.held().why(Job.objects.get(pk=j.pk)) for j in held}
    assert reasons == {
        "resource 'tenant:*' is paused",
        "resource 'group:acme' is paused",
        "resource 'queue:slow*' is paused",
    }
    for name in ("tenant:*", "group:acme", "queue:slow*"):
        jobqueue.resume_resource(name)
    assert run_burst() == 0
    assert {wait_for_job(j.pk, "done").state for j in held} == {"done"}


def test_a_paused_workflow_holds_its_children_at_any_depth_and_those_added_later():
    with jobqueue.container("outer") as outer:
        first = jobqueue.enqueue("test.noop", parent=outer)
        with jobqueue.container("inner", parent=outer) as inner:
            deep = jobqueue.enqueue("test.noop", parent=inner)
            assert jobqueue.pause_workflow(outer) is True
            later = jobqueue.enqueue("test.noop", parent=inner)  # after the pause
        after = jobqueue.enqueue("test.noop", parent=outer)
    other = jobqueue.enqueue("test.noop")
    assert run_burst() == 0
    assert wait_for_job(other.pk, "done")
    assert ready_untouched(first, deep, later, after)
    held = pausing.held()
    assert held.why(Job.objects.get(pk=deep.pk)) == "its workflow is paused"
    assert held.why(Job.objects.get(pk=outer.pk)) == f"workflow #{outer.pk} is paused"
    jobqueue.resume_workflow(outer)
    assert run_burst() == 0
    for job in (first, deep, later, after, inner, outer):
        wait_for_job(job.pk, "done")


def test_a_pause_of_a_job_in_a_workflow_holds_only_it_and_what_is_under_it():
    with jobqueue.container("box") as box:
        paused = jobqueue.enqueue("test.noop", parent=box)
        sibling = jobqueue.enqueue("test.noop", parent=box)
    jobqueue.pause_workflow(paused)
    assert run_burst() == 0
    assert wait_for_job(sibling.pk, "done")
    assert ready_untouched(paused)
    jobqueue.resume_workflow(paused.pk)
    assert run_burst() == 0
    wait_for_job(box.pk, "done")


def test_a_paused_workflows_top_is_pruned_with_its_pause():
    job = jobqueue.enqueue("test.noop")
    assert run_burst() == 0
    jobqueue.pause_workflow(job)
    Job.objects.filter(pk=job.pk).update(finished_at="2000-01-01T00:00:00Z")
    call_command("jobqueue_prune", "--older-than", "1s", stdout=StringIO())
    assert not Job.objects.filter(pk=job.pk).exists()
    assert not PausedWorkflow.objects.exists()


@pytest.mark.slow
def test_a_worker_finishes_running_work_and_starts_no_paused_work_until_resumed(
    start_worker, limits
):
    """A worker subprocess: jobs running when their resource or workflow is paused finish;
    the paused ones (a child added to the paused container later too) stay ready, losing
    nothing, while others run; resume lets them run."""
    env = {"JOBQUEUE_TEST_LIMITS": json.dumps(LIMITS)}
    worker = start_worker("--concurrency", "4", *FAST, env=env)
    worker.wait_registered()
    running = jobqueue.enqueue("test.sleep", {"seconds": 1.5}, uses={"tenant:7": 1})
    with jobqueue.container("flow") as box:
        running_child = jobqueue.enqueue("test.sleep", {"seconds": 1.5}, parent=box)
        for job in (running, running_child):
            wait_for_job(job.pk, "running")
        call_command("jobqueue_pause", "--resource", "tenant:*", stdout=StringIO())
        call_command("jobqueue_pause", "--workflow", str(box.pk), stdout=StringIO())
        time.sleep(1.5)  # the worker reads what is paused every FAIR_SHARE_REFRESH (1 s)
        # A claim that began before the refresh may still be under way: once a job enqueued
        # now is done, every later claim has read the pause.
        probe = jobqueue.enqueue("test.noop")
        for job in (running, running_child, probe):
            wait_for_job(job.pk, "done")
        waiting = [jobqueue.enqueue("test.noop", uses={"tenant:7": 1}) for _ in range(2)]
        late_child = jobqueue.enqueue("test.noop", parent=box)
        others = [jobqueue.enqueue("test.noop", uses={"openai": 1}) for _ in range(3)]
        for job in others:
            wait_for_job(job.pk, "done")
        time.sleep(1.0)  # several more polls
        assert ready_untouched(*waiting, late_child)
        call_command("jobqueue_resume", "--resource", "tenant:*", stdout=StringIO())
        for job in waiting:
            wait_for_job(job.pk, "done", timeout=30)
        assert ready_untouched(late_child)
        call_command("jobqueue_resume", "--workflow", str(box.pk), stdout=StringIO())
        wait_for_job(late_child.pk, "done", timeout=30)
    wait_for_job(box.pk, "done", timeout=30)
    assert worker.stop() == 0
    assert_clean_log(worker.output())
    assert poll(lambda: not Job.objects.exclude(state=Job.State.DONE).exists())


def test_a_pattern_matches_by_its_text_alone(limits):
    """Non-ASCII text matches as each database keeps it; LIKE's wildcards are plain text."""
    jobqueue.pause_resource("tenant:é*")
    jobqueue.pause_resource("tena_t:*")
    jobqueue.pause_resource("tenant:100%*")
    held = [
        jobqueue.enqueue("test.noop", uses={"tenant:é1": 1}),
        jobqueue.enqueue("test.noop", uses={"tenant:100%x": 1}),
    ]
    free = [
        jobqueue.enqueue("test.noop", uses={"tenant:e1": 1}),
        jobqueue.enqueue("test.noop", uses={"tenant:1000": 1}),
        jobqueue.enqueue("test.noop", uses={"openai": 2}),
    ]
    assert run_burst() == 0
    assert {wait_for_job(j.pk, "done").state for j in free} == {"done"}
    assert ready_untouched(*held)


def test_with_nothing_paused_the_claim_reads_as_before():
    from django_jobqueue import registry, versions
    from django_jobqueue.engine import leases

    types = registry.served()
    before = Job.objects.ready().in_queues(()).filter(versions.claim_filter(types))
    assert not pausing.held()
    ready = leases._ready("default", (), types, (), pausing.held())
    assert str(ready.query) == str(before.query)
    jobqueue.pause_resource("openai")
    held = leases._ready("default", (), types, (), pausing.held())
    assert str(held.query) != str(before.query)


def test_a_job_running_under_a_paused_workflow_has_what_it_spawns_held():
    """A job that started before its workflow was paused may spawn or map later: its children
    are held as the workflow's others are (it is read as a parent while it holds a lease)."""
    import datetime as dt

    from django.utils import timezone

    with jobqueue.container("box") as box:
        running = jobqueue.enqueue("test.noop", parent=box)
    Job.objects.filter(pk=running.pk).update(
        state="running",
        lease_owner="elsewhere",
        lease_expires=timezone.now() + dt.timedelta(hours=1),
    )
    jobqueue.pause_workflow(box)
    spawned = JobFactory(parent_id=running.pk)  # what ctx.spawn() writes: a ready child
    held = pausing.held()
    assert running.pk in held.parents
    assert not Job.objects.filter(pk=spawned.pk).exclude(held.condition()).exists()
    assert held.why(Job.objects.get(pk=spawned.pk)) == "its workflow is paused"
    assert run_burst() == 0
    assert ready_untouched(spawned)


@pytest.mark.parametrize(
    ("pattern", "held_jobs"),
    [
        ("*", {"plain", "grouped", "tenant"}),  # every job is of a queue
        ("q*", {"plain", "grouped", "tenant"}),
        ("g*", {"grouped"}),  # every job of a group, not those of none
        ("group:*", {"grouped"}),
        ("te*", {"tenant"}),
    ],
)
def test_what_a_short_pattern_holds_is_what_the_admin_says(limits, pattern, held_jobs):
    jobs = {
        "plain": jobqueue.enqueue("test.noop"),
        "grouped": jobqueue.enqueue("test.noop", group="acme"),
        "tenant": jobqueue.enqueue("test.noop", uses={"tenant:1": 1}),
    }
    jobqueue.pause_resource(pattern)
    held = pausing.held()
    claimable = set(Job.objects.exclude(held.condition()).values_list("pk", flat=True))
    said = {name for name, job in jobs.items() if held.why(Job.objects.get(pk=job.pk))}
    assert said == held_jobs
    assert {name for name, job in jobs.items() if job.pk not in claimable} == held_jobs
