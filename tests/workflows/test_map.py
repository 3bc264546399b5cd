"""ctx.map(), through `testing.run_jobs()` (the worker's own claim, run and record functions,
in this thread). With worker processes: tests/workflows/test_map_workers.py."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import django_jobqueue as jobqueue
from django_jobqueue.engine.maps import check_concurrency, item_args
from django_jobqueue.exceptions import InvalidJobError
from django_jobqueue.models import Job, JobMap, JobStep
from django_jobqueue.testing import RunawayJobsError, run_jobs

pytestmark = pytest.mark.django_db(transaction=True)


def row(job: Job | int) -> Job:
    return Job.objects.get(pk=job.pk if isinstance(job, Job) else job)


def kids(parent: Job) -> list[Job]:
    return list(Job.objects.filter(parent_id=parent.pk).order_by("pk"))


def mapping(items: list[Any], **args: Any) -> Job:
    return jobqueue.enqueue(args.pop("type", "map.parent"), {"items": items, **args})


@pytest.mark.parametrize("type", ["map.parent", "amap.parent"])
def test_map_returns_the_results_in_the_order_of_the_items(type):
    items = [3, {"x": 5}, 1, 2, {"x": 4}]
    parent = mapping(items, type=type)
    run_jobs()
    parent = row(parent)
    assert parent.state == Job.State.DONE, parent.last_error
    assert parent.result == {"results": [9, 25, 1, 4, 16]}
    children = kids(parent)
    # One child per item: a dict is its keyword arguments, anything else the one `item`.
    assert [c.args for c in children] == [{"item": 3}, {"x": 5}, {"item": 1}, {"item": 2},
                                          {"x": 4}]  # fmt: skip
    assert {c.type for c in children} == {"map.square"}
    record = JobStep.objects.get(job_id=parent.pk, name="@map").result
    first, last = children[0].pk, children[-1].pk
    assert record == {"type": "map.square", "total": 5, "first": first, "last": last,
                      "failures": 0, "failed": None}  # fmt: skip
    progress = JobMap.objects.get(job_id=parent.pk)
    assert (progress.total, progress.unfinished, progress.running) == (5, 0, 0)


def test_item_args():
    assert item_args({"a": 1}) == {"a": 1}
    assert item_args([1, 2]) == {"item": [1, 2]}
    assert item_args("s") == {"item": "s"}


def test_concurrency_holds_the_children_back_and_lets_one_go_as_each_finishes():
    parent = mapping(list(range(7)), concurrency=3, options={"queue": "kids"})
    run_jobs(queues="default")  # the parent alone: it spawns and suspends
    parent = row(parent)
    assert (parent.state, parent.lease_owner, parent.attempts) == ("waiting", None, 0)
    children = kids(parent)
    assert [c.state for c in children] == ["ready"] * 3 + ["waiting"] * 4
    progress = JobMap.objects.get(job_id=parent.pk)
    assert (progress.concurrency, progress.running, progress.unfinished) == (3, 3, 7)
    assert progress.released_through == children[2].pk
    # Each child that finishes lets the next held one go, in item order.
    report = run_jobs(queues="kids", max_runs=7)
    order = [job.pk for job in report.jobs]
    assert order == [c.pk for c in children]
    assert row(parent).state == Job.State.READY  # the last child made it runnable
    run_jobs()
    assert row(parent).result == {"results": [i * i for i in range(7)]}


def test_a_failed_child_raises_upstream_failed_and_the_parent_that_caught_it_is_done():
    items = [{"x": 1}, {"x": 2, "fail": True}, {"x": 3, "fail": True}, {"x": 4}]
    parent = mapping(items, concurrency=2, options={"max_attempts": 1})
    run_jobs()
    parent = row(parent)
    children = kids(parent)
    assert [c.state for c in children] == ["done", "dead", "dead", "done"]  # all ran
    # The handler met the failure (and caught it): the parent is done, not dead.
    assert parent.state == Job.State.DONE, parent.last_error
    assert parent.result == {"failed": f"child job {children[1].pk} ended dead (of 2 that did)"}


def test_a_replay_returns_the_same_results_and_never_spawns_again():
    parent = mapping([1, 2, 3], concurrency=1, fail_after=True)
    report = run_jobs()
    parent = row(parent)
    # Its first attempt failed after the map; the retry ran the handler again from the top.
    assert (parent.state, parent.attempts) == (Job.State.DONE, 2)
    assert parent.errors[0]["message"] == "after the map"
    assert report.attempts == 3 + 3  # the children, the parent's first run, resume, retry
    assert parent.result == {"results": [1, 4, 9]}
    assert len(kids(parent)) == 3
    assert JobMap.objects.filter(job_id=parent.pk).count() == 1


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_a_bad_concurrency_is_refused_before_anything_is_written(bad):
    with pytest.raises(InvalidJobError, match="concurrency must be None or an integer >= 1"):
        check_concurrency(bad)
    parent = jobqueue.enqueue("map.parent", {"items": [1, 2], "concurrency": bad}, max_attempts=1)
    run_jobs()
    parent = row(parent)
    assert parent.state == Job.State.DEAD
    assert "concurrency must be None or an integer >= 1" in parent.last_error["message"]
    assert kids(parent) == []
    assert not JobMap.objects.filter(job_id=parent.pk).exists()
    assert not JobStep.objects.filter(job_id=parent.pk).exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"depends_on": [1]}, "map\\(\\) takes no depends_on="),
        ({"unique_key": "k"}, "map\\(\\) takes no unique_key="),
        ({"colour": "red"}, "unknown options \\['colour'\\]"),
        ({"priority": "high"}, "priority"),
    ],
)
def test_bad_options_are_refused_before_anything_is_written(options, message):
    parent = jobqueue.enqueue("map.parent", {"items": [1, 2], "options": options}, max_attempts=1)
    run_jobs()
    parent = row(parent)
    assert parent.state == Job.State.DEAD
    assert kids(parent) == []
    assert re.search(message, parent.last_error["message"]), parent.last_error
    assert not JobStep.objects.filter(job_id=parent.pk).exists()


def test_an_unknown_handler_key_is_refused_before_anything_is_written():
    parent = jobqueue.enqueue(
        "map.parent", {"items": [1], "key": "no.such.handler"}, max_attempts=1
    )
    run_jobs()
    parent = row(parent)
    assert parent.state == Job.State.DEAD
    assert kids(parent) == []


def test_an_empty_list_returns_at_once_and_writes_nothing():
    parent = mapping([])
    report = run_jobs()
    parent = row(parent)
    assert parent.result == {"results": []}
    assert report.attempts == 1  # no suspension
    assert not JobStep.objects.filter(job_id=parent.pk).exists()
    assert not JobMap.objects.filter(job_id=parent.pk).exists()


def test_the_children_are_written_in_bulk():
    parent = mapping(list(range(1200)), concurrency=50, options={"queue": "kids"})
    with CaptureQueriesContext(connection) as queries:
        run_jobs(queues="default")
    inserts = [q["sql"] for q in queries.captured_queries if q["sql"].upper().startswith("INSERT")]
    # A few statements for 1,200 children (batches of 500, or parts that fit a packet).
    assert len(inserts) <= 12, len(inserts)
    assert len(kids(row(parent))) == 1200
    assert Job.objects.filter(parent_id=parent.pk, state="ready").count() == 50


def test_a_held_child_cancelled_counts_down_without_letting_another_go():
    parent = mapping([1, 2, 3, 4], concurrency=2, options={"queue": "kids"})
    run_jobs(queues="default")
    children = kids(row(parent))
    jobqueue.cancel(children[3])  # held back: it never ran
    progress = JobMap.objects.get(job_id=parent.pk)
    assert (progress.running, progress.unfinished) == (2, 3)
    assert row(children[2]).state == Job.State.WAITING  # not let go in its place
    run_jobs()
    parent = row(parent)
    assert parent.result == {
        "failed": f"child job {children[3].pk} ended cancelled (of 1 that did)"
    }
    assert [row(c).state for c in children] == ["done", "done", "done", "cancelled"]


def test_a_child_retried_while_its_map_is_open_counts_again():
    parent = mapping([{"x": 1, "fail": True}], options={"queue": "kids", "max_attempts": 1})
    run_jobs(queues="default")
    run_jobs(queues="kids")  # the child dies: the parent is runnable, not run yet
    (child,) = kids(row(parent))
    assert (row(child).state, row(parent).state) == (Job.State.DEAD, Job.State.READY)
    jobqueue.retry(child)
    progress = JobMap.objects.get(job_id=parent.pk)
    assert (progress.running, progress.unfinished) == (1, 1)
    run_jobs(queues="default")  # the parent finds its map open again and suspends
    assert row(parent).state == Job.State.WAITING
    run_jobs()
    parent = row(parent)
    assert row(child).attempts == 2
    assert parent.result == {"failed": f"child job {child.pk} ended dead (of 1 that did)"}


def test_cancelling_the_parent_cancels_the_held_children():
    parent = mapping([1, 2, 3], concurrency=1, options={"queue": "kids"})
    run_jobs(queues="default")
    jobqueue.cancel(parent)
    assert {c.state for c in kids(row(parent))} == {Job.State.CANCELLED}


def test_the_parents_admin_page_shows_the_maps_progress(admin_client):
    parent = mapping(list(range(7)), concurrency=3, options={"queue": "kids"})
    run_jobs(queues="default")  # it spawns and waits
    with pytest.raises(RunawayJobsError):  # two children run, five are left
        run_jobs(queues="kids", max_runs=2)
    page = admin_client.get(f"/admin/django_jobqueue/job/{parent.pk}/change/").content.decode()
    assert '<progress max="7" value="2"></progress> 2 / 7 children of map.square final' in page
    assert "(3 running, at most 3 at once)" in page
    run_jobs()
    page = admin_client.get(f"/admin/django_jobqueue/job/{parent.pk}/change/").content.decode()
    assert "7 / 7 children of map.square final</p>" in page
