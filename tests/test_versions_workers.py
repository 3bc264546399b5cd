"""Deploys with real worker processes of several releases: a rolling deploy resumes each job
under the version that began it, and what no live worker can resume waits; a replay that no
longer matches its records ends dead, and runs the new code once retried from a place."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

import django_jobqueue as jobqueue
from django_jobqueue.models import Job, JobStep
from tests.conftest import poll, wait_for_job
from tests.workflow_support import FAST

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FINAL = (Job.State.DONE, Job.State.DEAD)
REPORT = "versions.report"


def release(versions: str) -> dict[str, str]:
    """The environment of a worker whose code has these versions of versions.report."""
    return {"JOBQUEUE_TEST_REPORT_VERSIONS": versions}


OLD, NEW = {"JOBQUEUE_TEST_RELEASE": "old"}, {"JOBQUEUE_TEST_RELEASE": "new"}


def asleep(start_worker: Any, key: str, **args: Any) -> Job:
    """A job of `key` that an old release's worker ran until its sleep (then stopped)."""
    old = start_worker(*FAST, env=OLD)
    job = jobqueue.enqueue(key, args, max_attempts=3)
    poll(lambda: Job.objects.get(pk=job.pk).state == "scheduled", timeout=90)
    assert old.stop() == 0
    return job


def stats_json() -> dict[str, Any]:
    out = StringIO()
    call_command("jobqueue_stats", "--json", stdout=out)
    return json.loads(out.getvalue())


def test_a_rolling_deploy_resumes_each_sleeping_job_only_under_its_version(start_worker):
    old = start_worker(*FAST, env=release("1"))
    old_id = old.wait_registered().pk
    sleeping = [jobqueue.enqueue(REPORT, {"sleep": 3}, max_attempts=1) for _ in range(2)]
    ids = [job.pk for job in sleeping]
    poll(lambda: Job.objects.filter(pk__in=ids, state="scheduled").count() == 2)
    assert set(Job.objects.filter(pk__in=ids).values_list("handler_version", flat=True)) == {"1"}
    assert old.stop() == 0

    # The next release has only version 2: the sleeping jobs come due, and wait.
    new = start_worker(*FAST, env=release("2"))
    new.wait_registered()
    poll(lambda: Job.objects.filter(pk__in=ids, state="ready").count() == 2, timeout=90)
    fresh = jobqueue.enqueue(REPORT, {"sleep": 0.2}, max_attempts=1)
    done = wait_for_job(fresh.pk, *FINAL, timeout=90)
    assert (done.state, done.handler_version, done.result["version"]) == ("done", "2", "2")
    assert list(Job.objects.filter(pk__in=ids).values_list("state", "attempts")) == [
        ("ready", 0),
        ("ready", 0),
    ]
    assert stats_json()["unserved_versions"] == {REPORT: {"1": 2}}

    # A worker with both versions: it resumes them under version 1; new jobs take version 2.
    both = start_worker(*FAST, env=release("1,2"))
    both_id = both.wait_registered().pk
    for pk in ids:
        done = wait_for_job(pk, *FINAL, timeout=90)
        assert done.state == "done"
        assert done.result == {"first": "1", "version": "1", "worker": both_id}
        assert done.worker_ids == [old_id, both_id]
    newest = [jobqueue.enqueue(REPORT, {"sleep": 0.2}, max_attempts=1) for _ in range(4)]
    for job in newest:
        done = wait_for_job(job.pk, *FINAL, timeout=90)
        assert (done.state, done.handler_version, done.result["first"]) == ("done", "2", "2")
    assert stats_json()["unserved_versions"] == {}
    assert new.stop() == 0
    assert both.stop() == 0


def test_a_replay_that_no_longer_matches_ends_dead_and_a_retry_from_place_0_runs_the_new_code(
    start_worker,
):
    job = asleep(start_worker, "versions.reorder", sleep=2)
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


def test_a_patch_answers_false_to_a_job_past_its_point_and_true_to_a_new_job(start_worker):
    passed = asleep(start_worker, "versions.patch", sleep=2)
    new = start_worker(*FAST, env=NEW)
    fresh = jobqueue.enqueue("versions.patch", {"sleep": 2}, max_attempts=3)
    done = wait_for_job(passed.pk, *FINAL, timeout=90)
    assert (done.state, done.result) == ("done", {"patched": False})
    # The new job's answer was recorded before its sleep, and given again after it.
    done = wait_for_job(fresh.pk, *FINAL, timeout=90)
    assert (done.state, done.result) == ("done", {"patched": True})
    steps = JobStep.objects.filter(job_id=fresh.pk).order_by("place")
    assert list(steps.values_list("place", "name")) == [(1, "@patch"), (2, "a"), (3, "@sleep")]
    assert new.stop() == 0
