"""Deploys with real worker processes of several releases: a rolling deploy resumes each job
under the version that began it, and what no live worker can resume waits; a replay that no
longer matches its records ends dead, and runs the new code once retried from a place; a patch
answers False to a job past its point. Each for a handler, an async handler and a Django task
with takes_context=True (tests/testapp/version_jobs.py, version_tasks.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

import django_jobqueue as jobqueue
from django_jobqueue import registry
from django_jobqueue.models import Job, JobStep
from tests.conftest import poll, wait_for_job
from tests.support.markers import requires_task_options
from tests.support.workflow_support import FAST

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FINAL = (Job.State.DONE, Job.State.DEAD)


@dataclass(frozen=True)
class Kind:
    """The keys of the three handlers of one kind (handler, async handler, task)."""

    report: str
    reorder: str
    patch: str

    def enqueue(self, key: str, max_attempts: int, **args: Any) -> Job:
        """Enqueue a job of `key` as a user would: a task through its own enqueue()."""
        if not key.startswith("task:"):
            return jobqueue.enqueue(key, args, max_attempts=max_attempts)
        task = registry.get(key).func.task
        result = task.using(max_attempts=max_attempts).enqueue(**args)
        return Job.objects.get(pk=int(result.id))


TASKS = "task:default:tests.testapp.version_tasks."
KINDS = {
    "handler": Kind("versions.report", "versions.reorder", "versions.patch"),
    "async": Kind("versions.areport", "versions.areorder", "versions.apatch"),
    "task": Kind(f"{TASKS}versioned_report", f"{TASKS}reorder", f"{TASKS}patch_point"),
}


@pytest.fixture(
    params=[
        "handler",
        "async",
        pytest.param(
            "task",
            marks=requires_task_options("@task(**kwargs): 6.1+"),
        ),
    ]
)
def kind(request: pytest.FixtureRequest) -> Kind:
    return KINDS[request.param]


def release(versions: str) -> dict[str, str]:
    """The environment of a worker whose code has these versions of versions.report."""
    return {"JOBQUEUE_TEST_REPORT_VERSIONS": versions}


OLD, NEW = {"JOBQUEUE_TEST_RELEASE": "old"}, {"JOBQUEUE_TEST_RELEASE": "new"}


def asleep(start_worker: Any, kind: Kind, key: str, **args: Any) -> Job:
    """A job of `key` that an old release's worker ran until its sleep (then stopped)."""
    old = start_worker(*FAST, env=OLD)
    job = kind.enqueue(key, max_attempts=3, **args)
    poll(lambda: Job.objects.get(pk=job.pk).state == "scheduled", timeout=90)
    assert old.stop() == 0
    return job


def stats_json() -> dict[str, Any]:
    out = StringIO()
    call_command("jobqueue_stats", "--json", stdout=out)
    return json.loads(out.getvalue())


def test_a_rolling_deploy_resumes_each_sleeping_job_only_under_its_version(start_worker, kind):
    old = start_worker(*FAST, env=release("1"))
    old_id = old.wait_registered().pk
    sleeping = [kind.enqueue(kind.report, max_attempts=1, sleep=3) for _ in range(2)]
    ids = [job.pk for job in sleeping]
    poll(lambda: Job.objects.filter(pk__in=ids, state="scheduled").count() == 2)
    assert set(Job.objects.filter(pk__in=ids).values_list("handler_version", flat=True)) == {"1"}
    assert old.stop() == 0

    # The next release has only version 2: the sleeping jobs come due, and wait.
    new = start_worker(*FAST, env=release("2"))
    new.wait_registered()
    poll(lambda: Job.objects.filter(pk__in=ids, state="ready").count() == 2, timeout=90)
    fresh = kind.enqueue(kind.report, max_attempts=1, sleep=0.2)
    done = wait_for_job(fresh.pk, *FINAL, timeout=90)
    assert (done.state, done.handler_version, done.result["version"]) == ("done", "2", "2")
    assert list(Job.objects.filter(pk__in=ids).values_list("state", "attempts")) == [
        ("ready", 0),
        ("ready", 0),
    ]
    assert stats_json()["unserved_versions"] == {kind.report: {"1": 2}}

    # A worker with both versions: it resumes them under version 1; new jobs take version 2.
    both = start_worker(*FAST, env=release("1,2"))
    both_id = both.wait_registered().pk
    for pk in ids:
        done = wait_for_job(pk, *FINAL, timeout=90)
        assert done.state == "done"
        assert done.result == {"first": "1", "version": "1", "worker": both_id}
        assert done.worker_ids == [old_id, both_id]
    newest = [kind.enqueue(kind.report, max_attempts=1, sleep=0.2) for _ in range(4)]
    for job in newest:
        done = wait_for_job(job.pk, *FINAL, timeout=90)
        assert (done.state, done.handler_version, done.result["first"]) == ("done", "2", "2")
    assert stats_json()["unserved_versions"] == {}
    assert new.stop() == 0
    assert both.stop() == 0


def test_a_replay_that_no_longer_matches_ends_dead_and_a_retry_from_place_0_runs_the_new_code(
    start_worker, kind
):
    job = asleep(start_worker, kind, kind.reorder, sleep=2)
    assert list(JobStep.objects.filter(job=job).order_by("place").values_list("place", "name")) == [
        (1, "a"),
        (2, "b"),
        (3, "@sleep"),
    ]
    new = start_worker(*FAST, env=NEW)  # b before a
    dead = wait_for_job(job.pk, *FINAL, timeout=90)
    assert (dead.state, dead.attempts) == ("dead", 1)  # no retry: each would meet it again
    error = dead.last_error
    assert (error["type"], error["place"]) == ("django_jobqueue.exceptions.ReplayMismatch", 1)
    assert (
        "at place 1 its handler asks for step 'b', where step 'a' was recorded"
        in (error["message"])
    )
    jobqueue.retry(job, keep_places_through=0)
    done = wait_for_job(job.pk, *FINAL, timeout=90)
    assert (done.state, done.result) == ("done", ["b", "a"])
    assert new.stop() == 0


def test_a_patch_answers_false_to_a_job_past_its_point_and_true_to_a_new_job(start_worker, kind):
    passed = asleep(start_worker, kind, kind.patch, sleep=2)
    new = start_worker(*FAST, env=NEW)
    fresh = kind.enqueue(kind.patch, max_attempts=3, sleep=2)
    done = wait_for_job(passed.pk, *FINAL, timeout=90)
    assert (done.state, done.result) == ("done", {"patched": False})
    # The new job's answer was recorded before its sleep, and given again after it.
    done = wait_for_job(fresh.pk, *FINAL, timeout=90)
    assert (done.state, done.result) == ("done", {"patched": True})
    steps = JobStep.objects.filter(job_id=fresh.pk).order_by("place")
    assert list(steps.values_list("place", "name")) == [(1, "@patch"), (2, "a"), (3, "@sleep")]
    assert new.stop() == 0
