"""ctx.wait_for(count=N) and ctx.wait_for_any(), through `testing.run_jobs()` (the worker's
own claim, run and record functions, in this thread: a job runs one at a time, the oldest
first, so a parent resumes as soon as what it waits for allows). With worker processes:
tests/workflows/test_fanout_workers.py."""

from __future__ import annotations

from typing import Any

import pytest

import django_jobqueue as jobqueue
from django_jobqueue.engine.fanout import check_count
from django_jobqueue.exceptions import InvalidJobError
from django_jobqueue.models import Job, JobDependency, JobStep, JobWait
from django_jobqueue.testing import run_jobs

pytestmark = pytest.mark.django_db(transaction=True)


def children(*specs: dict[str, Any]) -> list[list[Any]]:
    """[type, args, options] of `durable.child` jobs: each spec holds `i`, maybe `fail`."""
    return [
        ["durable.child", spec, {"max_attempts": 1} if spec.get("fail") else {}] for spec in specs
    ]


def row(job: Job | int) -> Job:
    return Job.objects.get(pk=job.pk if isinstance(job, Job) else job)


def kids(parent: Job) -> list[Job]:
    return list(Job.objects.filter(parent_id=parent.pk).order_by("pk"))


@pytest.mark.parametrize("type", ["fanout.race", "afanout.race"])
def test_wait_for_any_returns_the_first_final_job_and_the_others_still_run(type):
    parent = jobqueue.enqueue(type, {"children": children({"i": 1}, {"i": 2}, {"i": 3}),
                                     "first": True})  # fmt: skip
    run_jobs()
    parent = row(parent)
    first, second, third = kids(parent)
    assert parent.state == Job.State.DONE, parent.last_error
    # The parent resumed once its first child was final, before the others ran.
    assert parent.result["results"] == {str(first.pk): 1}
    assert [c.state for c in (first, second, third)] == [Job.State.DONE] * 3
    record = JobStep.objects.get(job_id=parent.pk, name="@wait").result
    assert record == {
        "ids": [first.pk, second.pk, third.pk],
        "count": 1,
        "states": {str(first.pk): "done"},
    }
    # The wait's edges to the jobs it did not need, and its count, went with it.
    assert not JobWait.objects.filter(job_id=parent.pk).exists()
    edges = JobDependency.objects.filter(job_id=parent.pk)
    assert list(edges.values_list("depends_on_id", flat=True)) == [first.pk]


@pytest.mark.parametrize("type", ["fanout.race", "afanout.race"])
def test_cancel_rest_cancels_the_jobs_still_unfinished(type):
    parent = jobqueue.enqueue(type, {"children": children({"i": 1}, {"i": 2}, {"i": 3}),
                                     "first": True, "cancel_rest": True})  # fmt: skip
    run_jobs()
    parent = row(parent)
    first, second, third = kids(parent)
    # The cancelled children were the handler's to cancel: the parent is done, not dead.
    assert parent.state == Job.State.DONE, parent.last_error
    assert parent.result["results"] == {str(first.pk): 1}
    assert [c.state for c in (first, second, third)] == ["done", "cancelled", "cancelled"]
    assert (second.attempts, third.attempts) == (0, 0)  # they never ran
    record = JobStep.objects.get(job_id=parent.pk, name="@wait").result
    assert record["cancelled"] == [second.pk, third.pk]


def test_wait_for_count_returns_once_that_many_are_final():
    parent = jobqueue.enqueue(
        "fanout.race", {"children": children({"i": 1}, {"i": 2}, {"i": 3}), "count": 2}
    )
    run_jobs()
    parent = row(parent)
    first, second, _ = kids(parent)
    assert parent.state == Job.State.DONE, parent.last_error
    assert parent.result["results"] == {str(first.pk): 1, str(second.pk): 4}


def test_a_count_equal_to_the_number_of_jobs_is_a_wait_for_all():
    parent = jobqueue.enqueue("fanout.race", {"children": children({"i": 1}, {"i": 2}), "count": 2})
    run_jobs()
    parent = row(parent)
    assert parent.state == Job.State.DONE
    assert sorted(parent.result["results"].values()) == [1, 4]
    record = JobStep.objects.get(job_id=parent.pk, name="@wait").result
    assert "count" not in record  # the same record as wait_for(jobs)


@pytest.mark.parametrize("cancel_rest", [False, True])
def test_a_failed_job_counts_toward_count_and_raises_upstream_failed(cancel_rest):
    """The first child to be final failed: it is among the first N, so the wait raises."""
    parent = jobqueue.enqueue("fanout.race", {
        "children": children({"i": 1, "fail": True}, {"i": 2}, {"i": 3}),
        "first": True, "cancel_rest": cancel_rest,
    })  # fmt: skip
    run_jobs()
    parent = row(parent)
    first, second, third = kids(parent)
    assert parent.state == Job.State.DONE, parent.last_error  # the handler caught it
    assert parent.result["failed"] == f"job {first.pk} ended dead"
    rest = ["cancelled", "cancelled"] if cancel_rest else ["done", "done"]
    assert [first.state, second.state, third.state] == ["dead", *rest]


def test_a_failure_after_the_first_n_is_not_raised_and_does_not_fail_the_parent():
    """The wait got its first job; a child that dies later was still waited for: the
    parent, done with its children, ends done."""
    parent = jobqueue.enqueue("fanout.race", {
        "children": children({"i": 1}, {"i": 2, "fail": True}), "first": True,
    })  # fmt: skip
    run_jobs()
    parent = row(parent)
    first, second = kids(parent)
    assert (first.state, second.state) == ("done", "dead")
    assert parent.state == Job.State.DONE, parent.last_error
    assert parent.result["results"] == {str(first.pk): 1}


def test_a_replay_returns_the_same_jobs_though_more_are_final_since():
    parent = jobqueue.enqueue("fanout.race", {
        "children": children({"i": 1}, {"i": 2}, {"i": 3}), "first": True, "fail_after": True,
    })  # fmt: skip
    run_jobs()
    parent = row(parent)
    first, *_ = kids(parent)
    assert all(c.state == Job.State.DONE for c in kids(parent))
    # The second attempt ran after every child was done, and got the first one only.
    assert (parent.state, parent.attempts) == (Job.State.DONE, 2)
    assert parent.result["results"] == {str(first.pk): 1}
    assert JobStep.objects.filter(job_id=parent.pk, name="@wait").count() == 1


def test_a_job_past_its_wait_for_any_is_not_woken_when_the_others_finish():
    """After the wait, the job waits for an event: the other job it no longer waits for
    finishing must leave it waiting (its edge and its count are gone)."""
    quick = jobqueue.enqueue("test.noop", queue="quick")
    slow = jobqueue.enqueue("test.noop", queue="slow")
    waiter = jobqueue.enqueue(
        "fanout.any_then_event", {"ids": [quick.pk, slow.pk], "key": "go"}, queue="quick"
    )
    run_jobs(queues=["quick"])
    assert row(waiter).state == Job.State.WAITING
    assert JobWait.objects.get(job_id=waiter.pk).key == "go"
    run_jobs(queues=["slow"])
    assert row(slow).state == Job.State.DONE
    assert row(waiter).state == Job.State.WAITING  # still waiting for its event
    jobqueue.send_event("go", 7)
    run_jobs(queues=["quick"])
    waiter = row(waiter)
    assert (waiter.state, waiter.result) == (Job.State.DONE, {"first": [quick.pk], "payload": 7})


def test_a_job_waiting_for_one_of_many_shows_the_count_in_the_admin():
    from django_jobqueue.admin.durable import waits_for

    slow = [jobqueue.enqueue("test.noop", queue="slow") for _ in range(3)]
    waiter = jobqueue.enqueue("fanout.any_then_event",
                              {"ids": [j.pk for j in slow], "key": "go"})  # fmt: skip
    run_jobs(queues=["default"])
    waiter = row(waiter)
    assert waiter.state == Job.State.WAITING
    assert JobWait.objects.get(job_id=waiter.pk).count == 1
    assert "1 of 3 jobs to be final (0 final)" in str(waits_for(waiter))


@pytest.mark.parametrize(
    ("count", "ids", "expected"),
    [(None, [1, 2], None), (1, [1, 2], 1), (2, [1, 2], None), (3, [1, 2, 3, 4], 3)],
)
def test_check_count_says_how_many_a_wait_needs(count, ids, expected):
    assert check_count(count, ids) == expected


@pytest.mark.parametrize("count", [0, -1, 3, True, 1.0, "1"])
def test_a_count_the_jobs_cannot_meet_is_refused(count):
    with pytest.raises(InvalidJobError):
        check_count(count, [1, 2])


def test_a_wait_for_a_job_cancelled_by_a_cascade_from_its_upstream_returns():
    """The awaited child is cancelled because the job it depends on died: the wait ends
    (UpstreamFailed), it does not wait forever."""
    parent = jobqueue.enqueue("fanout.wait_downstream")
    run_jobs()
    parent = row(parent)
    doomed, below = kids(parent)
    assert (doomed.state, below.state) == (Job.State.DEAD, Job.State.CANCELLED)
    record = JobStep.objects.get(job_id=parent.pk, name="@wait").result
    assert record == {"ids": [below.pk], "states": {str(below.pk): "cancelled"}}
    assert parent.result == {"failed": f"job {below.pk} ended cancelled"}
    # The child it did not wait for died: that fails the parent, as for any spawner.
    assert parent.state == Job.State.DEAD
    assert parent.last_error["message"] == f"child job {doomed.pk} ended dead"


def test_a_wait_for_a_child_cancelled_with_its_parent_returns():
    """Another job waits for a spawned child; cancelling the spawner cancels the child, and
    the wait ends."""
    spawner = jobqueue.enqueue("durable.spawner", {"count": 2, "wait": False, "hold": 0})
    # The spawner runs alone first, and waits for its children once it has returned.
    Job.objects.filter(pk=spawner.pk).update(queue="first")
    run_jobs(queues="first")
    children = kids(row(spawner))
    assert [c.state for c in children] == ["ready", "ready"]
    Job.objects.filter(pk__in=[c.pk for c in children]).update(queue="later")
    waiter = jobqueue.enqueue("fanout.wait_ids", {"ids": [children[0].pk]}, queue="first")
    run_jobs(queues="first")
    assert row(waiter).state == Job.State.WAITING
    assert row(spawner).state == Job.State.WAITING
    jobqueue.cancel(spawner)
    assert row(children[0]).state == Job.State.CANCELLED
    run_jobs(queues="first")
    waiter = row(waiter)
    assert waiter.state == Job.State.DONE, (waiter.state, waiter.last_error)
    assert waiter.result == {"failed": f"job {children[0].pk} ended cancelled"}
