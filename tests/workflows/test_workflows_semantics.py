"""Workflow semantics, run by in-process burst workers: dependencies, upstream results,
failure propagation and revival by retry, containers (roll-up, sealing, nesting), cancel,
unique keys and the graph builder."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.models import Count
from django.test.utils import CaptureQueriesContext

import django_jobqueue as jobqueue
from django_jobqueue.dialects import get_dialect
from django_jobqueue.engine import leases, workflows
from django_jobqueue.exceptions import InvalidDependencyError, InvalidJobError
from django_jobqueue.models import Job, JobDependency
from tests.support.workflow_support import drain, run_burst, states
from tests.testapp.models import RunRecord

pytestmark = pytest.mark.django_db(transaction=True)

UPSTREAM_FAILED = "django_jobqueue.exceptions.UpstreamFailed"


def failing(**kwargs):
    """Enqueue a job that fails on its first attempt, with no attempt to spare: it ends dead."""
    return jobqueue.enqueue("wf.step", {"fail_until": 1}, max_attempts=1, **kwargs)


def run_of(job: Job) -> RunRecord:
    return RunRecord.objects.get(job_id=job.pk, attempt=Job.objects.get(pk=job.pk).attempts)


# -- dependencies ----------------------------------------------------------------------------


def test_job_runs_only_once_every_upstream_is_done():
    a = jobqueue.enqueue("wf.step")
    b = jobqueue.enqueue("wf.step", run_after=dt.timedelta(hours=1))  # held back for now
    c = jobqueue.enqueue("wf.step", depends_on=[a, b])
    assert states(a, b, c) == ("ready", "scheduled", "waiting")

    run_burst()
    # a is done, but b is not: c still waits.
    assert states(a, b, c) == ("done", "scheduled", "waiting")
    assert not RunRecord.objects.filter(job_id=c.pk).exists()

    Job.objects.filter(pk=b.pk).update(run_after=None, state="ready")
    run_burst()
    assert states(a, b, c) == ("done", "done", "done")
    assert run_of(c).started >= max(run_of(a).finished, run_of(b).finished)
    assert c.started_at >= max(a.finished_at, b.finished_at)


def test_handler_sees_upstream_results_by_job_id():
    a = jobqueue.enqueue("test.add", {"a": 1, "b": 2})
    b = jobqueue.enqueue("test.add", {"a": 3, "b": 4})
    with jobqueue.container("box") as box:
        jobqueue.enqueue("test.add", {"a": 5, "b": 6}, parent=box)
    c = jobqueue.enqueue("wf.echo_upstream", depends_on=[a, b, box])
    lone = jobqueue.enqueue("wf.echo_upstream")
    run_burst()
    assert states(a, b, box, c, lone) == ("done",) * 5
    # Exactly the jobs c depends on, by id; a container has no result of its own.
    assert c.result == {str(a.pk): 3, str(b.pk): 7, str(box.pk): None}
    assert lone.result == {}


def test_dependency_on_an_unsaved_or_missing_job_is_rejected():
    existing = jobqueue.enqueue("test.noop")
    unsaved = Job(type="test.noop")
    missing = existing.pk + 10_000
    with pytest.raises(InvalidDependencyError, match="not saved"):
        jobqueue.enqueue("test.noop", depends_on=[unsaved])
    with pytest.raises(InvalidDependencyError, match=rf"\[{missing}\] do not exist"):
        jobqueue.enqueue("test.noop", depends_on=[existing, missing])
    with pytest.raises(InvalidDependencyError, match="not a container"):
        jobqueue.enqueue("test.noop", parent=existing)
    with pytest.raises(InvalidDependencyError, match="neither saved nor part of this graph"):
        jobqueue.Graph().add("test.noop", depends_on=[unsaved])
    with pytest.raises(InvalidDependencyError, match="do not exist"), jobqueue.graph() as g:
        first = g.add("test.noop")
        g.add("test.noop", depends_on=[first, missing])
    # Nothing of the rejected jobs or graphs was written.
    assert list(Job.objects.values_list("pk", flat=True)) == [existing.pk]
    assert not JobDependency.objects.exists()


def test_a_child_cannot_wait_for_its_own_container():
    """Edges only point at existing jobs, but a container finishes after its children: a child
    depending on its container, directly or through other jobs, would deadlock both."""
    with (
        jobqueue.container("outer") as outer,
        jobqueue.container("inner", parent=outer) as inner,
    ):
        sibling = jobqueue.enqueue("test.noop", parent=inner)
        with pytest.raises(InvalidDependencyError, match="cycle"):
            jobqueue.enqueue("test.noop", parent=inner, depends_on=[inner])
        with pytest.raises(InvalidDependencyError, match="cycle"):
            jobqueue.enqueue("test.noop", parent=inner, depends_on=[outer])
        # A job outside the container may wait for it; a child may not wait for that job.
        after_inner = jobqueue.enqueue("test.noop", depends_on=[inner])
        with pytest.raises(InvalidDependencyError, match="cycle"):
            jobqueue.enqueue("test.noop", parent=inner, depends_on=[sibling, after_inner])
        # Waiting for a sibling is fine.
        second = jobqueue.enqueue("test.noop", parent=inner, depends_on=[sibling])
    with pytest.raises(InvalidDependencyError, match="cycle"), jobqueue.graph() as g:
        box = g.container("box")
        g.add("test.noop", parent=box, depends_on=[box])
    with pytest.raises(InvalidDependencyError, match="cycle"), jobqueue.graph() as g:
        box = g.container("box")
        waiting_for_box = g.add("test.noop", depends_on=[box])
        g.add("test.noop", parent=box, depends_on=[waiting_for_box])
    with jobqueue.container("open") as open_box:
        after_open = jobqueue.enqueue("test.noop", depends_on=[open_box])
        # The cycle runs through existing jobs.
        with pytest.raises(InvalidDependencyError, match="cycle"), jobqueue.graph() as g:
            g.add("test.noop", parent=open_box, depends_on=[after_open])
    assert Job.objects.count() == 7  # outer, inner, sibling, after_inner, second, open, after_open
    run_burst()
    assert states(outer, inner, sibling, second, after_inner, open_box, after_open) == (
        ("done",) * 7
    )


# -- failure propagation and revival ---------------------------------------------------------


def test_dead_job_cancels_its_downstream_transitively_naming_it():
    bad = failing()
    d1 = jobqueue.enqueue("wf.step", depends_on=[bad])
    d2 = jobqueue.enqueue("wf.step", depends_on=[d1])
    fine = jobqueue.enqueue("wf.step")
    also = jobqueue.enqueue("wf.step", depends_on=[fine, d1])
    run_burst()
    assert states(bad, d1, d2, fine, also) == (
        "dead",
        "cancelled",
        "cancelled",
        "done",
        "cancelled",
    )
    assert bad.last_error["message"].startswith(f"failing attempt 1 of job {bad.pk}")
    for job in (d1, d2, also):
        assert job.cancelled_by_id == bad.pk
        assert job.last_error["type"] == UPSTREAM_FAILED
        assert job.last_error["message"] == f"upstream job {bad.pk} ended dead"
        assert job.finished_at is not None and job.started_at is None
    assert set(RunRecord.objects.values_list("job_id", flat=True)) == {bad.pk, fine.pk}


def test_cancelled_upstream_cancels_downstream_naming_it():
    up = jobqueue.enqueue("wf.step", run_after=dt.timedelta(hours=1))
    down = jobqueue.enqueue("wf.step", depends_on=[up])
    assert jobqueue.cancel(up) is True
    assert states(up, down) == ("cancelled", "cancelled")
    assert down.cancelled_by_id == up.pk
    assert down.last_error["message"] == f"upstream job {up.pk} ended cancelled"
    # Retrying a cancelled job revives what its cancellation cancelled.
    jobqueue.retry(up)
    Job.objects.filter(pk=up.pk).update(run_after=None)
    run_burst()
    assert states(up, down) == ("done", "done")


def test_retry_revives_the_cancelled_downstream_and_reopens_the_container():
    with jobqueue.container("batch") as batch:
        bad = jobqueue.enqueue(
            "test.fail_then_succeed", {"failures": 1}, parent=batch, max_attempts=1
        )
        down = jobqueue.enqueue("test.add", {"a": 1, "b": 1}, parent=batch, depends_on=[bad])
    after = jobqueue.enqueue("test.noop", depends_on=[batch])
    run_burst()
    assert states(bad, down, batch, after) == ("dead", "cancelled", "dead", "cancelled")
    assert down.cancelled_by_id == bad.pk
    assert batch.last_error["message"] == f"child job {bad.pk} ended dead"
    assert after.cancelled_by_id == batch.pk
    assert after.last_error["message"] == f"upstream job {batch.pk} ended dead"

    retried = jobqueue.retry(bad, extra_attempts=1)
    assert (retried.state, retried.attempts, retried.max_attempts) == ("ready", 1, 2)
    assert states(bad, down, batch, after) == ("ready", "waiting", "waiting", "waiting")
    assert all(j.finished_at is None and j.cancelled_by_id is None for j in (down, after))
    run_burst()
    assert states(bad, down, batch, after) == ("done",) * 4
    assert (bad.attempts, bad.max_attempts, bad.result) == (2, 2, "ok on attempt 2")


def test_retry_revives_jobs_in_another_container_and_reopens_it():
    bad = failing()
    with jobqueue.container("other") as other:
        child = jobqueue.enqueue("wf.step", parent=other, depends_on=[bad])
        sibling = jobqueue.enqueue("wf.step", parent=other)
    report = jobqueue.enqueue("wf.step", depends_on=[other])
    run_burst()
    assert states(bad, child, sibling, other, report) == (
        "dead", "cancelled", "done", "dead", "cancelled",
    )  # fmt: skip
    assert report.cancelled_by_id == other.pk
    jobqueue.retry(bad)
    assert states(child, other, report) == ("waiting", "waiting", "waiting")
    Job.objects.filter(pk=bad.pk).update(args={"fail_until": 0})
    run_burst()
    assert states(bad, child, sibling, other, report) == ("done",) * 5


def test_retry_adds_attempts_and_never_resets_the_count():
    job = jobqueue.enqueue("test.fail_then_succeed", {"failures": 2}, max_attempts=2)
    drain()
    assert states(job) == ("dead",)
    assert (job.attempts, job.max_attempts) == (2, 2)
    job = jobqueue.retry(job, extra_attempts=1)
    assert (job.state, job.attempts, job.max_attempts) == ("ready", 2, 3)
    assert job.finished_at is None and job.unique_slot == 1
    drain()
    assert states(job) == ("done",)
    assert (job.attempts, job.result) == (3, "ok on attempt 3")


def test_retry_refuses_what_it_cannot_retry():
    bad = failing()
    down = jobqueue.enqueue("wf.step", depends_on=[bad])
    with jobqueue.container("box") as box:
        jobqueue.enqueue("test.fail_hard", parent=box)
    ready = jobqueue.enqueue("test.noop", run_after=dt.timedelta(hours=1))
    run_burst()
    assert states(bad, down, box, ready) == ("dead", "cancelled", "dead", "scheduled")
    with pytest.raises(InvalidJobError, match="only dead or cancelled jobs retry"):
        jobqueue.retry(ready)
    with pytest.raises(InvalidJobError, match="container"):
        jobqueue.retry(box)
    with pytest.raises(InvalidJobError, match=f"waits on job {bad.pk}"):
        jobqueue.retry(down)
    with pytest.raises(InvalidJobError, match="does not exist"):
        jobqueue.retry(ready.pk + 1000)
    for extra in (0, -1):
        with pytest.raises(Exception, match="extra_attempts"):
            jobqueue.retry(bad, extra_attempts=extra)
    assert states(bad, down) == ("dead", "cancelled")


def test_job_added_downstream_of_a_dead_job_is_cancelled_and_revived_by_retry():
    bad = failing()
    run_burst()
    late = jobqueue.enqueue("wf.step", depends_on=[bad])
    assert late.state == "cancelled" and late.cancelled_by_id == bad.pk
    assert late.last_error["message"] == f"upstream job {bad.pk} ended dead"
    with jobqueue.graph() as g:
        first = g.add("wf.step", depends_on=[bad])
        second = g.add("wf.step", depends_on=[first])
        other = g.add("wf.step")
    assert (first.state, second.state, other.state) == ("cancelled", "cancelled", "ready")
    assert first.cancelled_by_id == second.cancelled_by_id == bad.pk
    jobqueue.retry(bad)
    Job.objects.filter(pk=bad.pk).update(args={})
    run_burst()
    assert states(bad, late, first, second, other) == ("done",) * 5


# -- containers --------------------------------------------------------------------------------


def test_container_rolls_up_done_and_unblocks_its_downstream():
    with jobqueue.container("batch", group="t") as batch:
        a = jobqueue.enqueue("test.add", {"a": 1, "b": 2}, parent=batch)
        b = jobqueue.enqueue("test.add", {"a": 3, "b": 4}, parent=batch, depends_on=[a])
    report = jobqueue.enqueue("test.upstream_sum", depends_on=[batch])
    assert states(batch) == ("waiting",) and batch.sealed and batch.is_container
    run_burst()
    assert states(a, b, batch, report) == ("done",) * 4
    assert batch.finished_at >= max(a.finished_at, b.finished_at)
    assert report.started_at >= batch.finished_at
    assert batch.attempts == 0 and batch.started_at is None  # a container never dispatches
    assert batch.group_key == "t"


def test_roll_up_happens_in_the_childs_completion_transaction(monkeypatch):
    """Fault injection: a crash right after the roll-up, inside the transaction that records
    the child's result, undoes both; without the crash both commit together."""
    with jobqueue.container("batch") as batch:
        child = jobqueue.enqueue("wf.step", parent=batch)
    dialect = get_dialect(connection.alias)
    [claimed] = leases.claim(dialect, owner="w", queues=[], limit=1, lease_ttl=30)
    lease = leases.Lease(claimed.pk, "w", claimed.attempts)
    real_roll_up = workflows.roll_up

    def roll_up_then_crash(dialect, container_id, **kwargs):
        real_roll_up(dialect, container_id, **kwargs)
        assert connection.in_atomic_block
        assert Job.objects.get(pk=container_id).state == "done"  # seen inside the transaction
        raise RuntimeError("crash after the roll-up")

    monkeypatch.setattr(workflows, "roll_up", roll_up_then_crash)
    with pytest.raises(RuntimeError, match="crash after the roll-up"):
        leases.finish(dialect, lease, {"me": child.pk}, parent_id=batch.pk)
    assert states(child, batch) == ("running", "waiting")
    assert child.result is None and batch.finished_at is None
    monkeypatch.undo()
    assert leases.finish(dialect, lease, {"me": child.pk}, parent_id=batch.pk) == "done"
    assert states(child, batch) == ("done", "done")


def test_container_is_sealed_only_when_its_block_exits():
    """A first child finishing before the second is added must not complete the container."""
    with jobqueue.container("batch") as batch:
        first = jobqueue.enqueue("wf.step", parent=batch)
        run_burst()
        assert states(first, batch) == ("done", "waiting")
        assert not batch.sealed
        second = jobqueue.enqueue("wf.step", parent=batch)
    assert states(first, second, batch) == ("done", "ready", "waiting")
    assert batch.sealed
    run_burst()
    assert states(first, second, batch) == ("done", "done", "done")


def test_container_whose_children_finished_before_sealing_is_done_at_seal():
    with jobqueue.container("batch") as batch:
        child = jobqueue.enqueue("wf.step", parent=batch)
        run_burst()
        assert states(child, batch) == ("done", "waiting")
    assert states(batch) == ("done",)


def test_empty_sealed_container_is_done_at_once():
    with jobqueue.container("empty") as batch:
        assert states(batch) == ("waiting",)
    assert states(batch) == ("done",)
    with jobqueue.graph() as g:
        box = g.container("empty in a graph")
        after = g.add("test.noop", depends_on=[box])
    assert states(box, after) == ("done", "ready")


def test_a_sealed_container_takes_no_more_children():
    with jobqueue.container("batch") as batch:
        jobqueue.enqueue("wf.step", parent=batch)
    with pytest.raises(InvalidDependencyError, match="sealed"):
        jobqueue.enqueue("wf.step", parent=batch)
    with (
        pytest.raises(InvalidDependencyError, match="sealed"),
        jobqueue.container("late", parent=batch),
    ):
        pass
    with pytest.raises(InvalidDependencyError, match="sealed"), jobqueue.graph() as g:
        g.add("wf.step", parent=batch)
    with jobqueue.graph() as g:  # graph containers are sealed when the graph is saved
        box = g.container("box")
        g.add("wf.step", parent=box)
    with pytest.raises(InvalidDependencyError, match="sealed"):
        jobqueue.enqueue("wf.step", parent=box)
    assert Job.objects.count() == 4


def test_nested_containers_roll_up_inside_out():
    with jobqueue.container("outer") as outer:
        with jobqueue.container("inner", parent=outer) as inner:
            leaves = [jobqueue.enqueue("wf.step", parent=inner) for _ in range(3)]
        direct = jobqueue.enqueue("wf.step", parent=outer, depends_on=[inner])
    report = jobqueue.enqueue("wf.step", depends_on=[outer])
    run_burst()
    assert states(outer, inner, direct, report, *leaves) == ("done",) * 7
    assert inner.finished_at >= max(leaf.finished_at for leaf in leaves)
    assert direct.started_at >= inner.finished_at
    assert outer.finished_at >= max(inner.finished_at, direct.finished_at)
    assert report.started_at >= outer.finished_at


def test_failure_deep_in_nested_containers_propagates_and_retry_revives_all():
    with jobqueue.container("outer") as outer:
        with jobqueue.container("inner", parent=outer) as inner:
            bad = failing(parent=inner)
            ok = jobqueue.enqueue("wf.step", parent=inner)
        sibling = jobqueue.enqueue("wf.step", parent=outer, depends_on=[inner])
    report = jobqueue.enqueue("wf.step", depends_on=[outer])
    run_burst()
    assert states(bad, ok, inner, sibling, outer, report) == (
        "dead", "done", "dead", "cancelled", "dead", "cancelled",
    )  # fmt: skip
    assert inner.last_error["message"] == f"child job {bad.pk} ended dead"
    assert sibling.cancelled_by_id == inner.pk
    assert outer.last_error["message"] == f"child job {inner.pk} ended dead"
    assert report.cancelled_by_id == outer.pk

    jobqueue.retry(bad)
    assert states(bad, ok, inner, sibling, outer, report) == (
        "ready", "done", "waiting", "waiting", "waiting", "waiting",
    )  # fmt: skip
    Job.objects.filter(pk=bad.pk).update(args={})
    run_burst()
    assert states(bad, ok, inner, sibling, outer, report) == ("done",) * 6


def test_container_block_that_raises_cancels_the_container_and_children():
    with pytest.raises(RuntimeError, match="producer broke"), jobqueue.container("batch") as batch:
        child = jobqueue.enqueue("wf.step", parent=batch)
        raise RuntimeError("producer broke")
    after = jobqueue.enqueue("wf.step", depends_on=[batch])
    assert states(batch, child, after) == ("cancelled", "cancelled", "cancelled")
    run_burst()
    assert not RunRecord.objects.exists()


# -- cancel ------------------------------------------------------------------------------------


def test_cancel_ready_job_cancels_it_and_its_downstream_at_once():
    a = jobqueue.enqueue("wf.step")
    b = jobqueue.enqueue("wf.step", depends_on=[a])
    c = jobqueue.enqueue("wf.step", depends_on=[b])
    assert jobqueue.cancel(a) is True
    assert states(a, b, c) == ("cancelled", "cancelled", "cancelled")
    assert a.cancel_requested and a.cancelled_by_id is None and a.finished_at is not None
    assert b.cancelled_by_id == a.pk and c.cancelled_by_id == a.pk
    assert jobqueue.cancel(a) is False  # already final
    assert jobqueue.cancel(c.pk) is False
    with pytest.raises(InvalidJobError, match="does not exist"):
        jobqueue.cancel(c.pk + 1000)
    run_burst()
    assert not RunRecord.objects.exists()


def test_cancel_container_cancels_its_unfinished_children():
    with jobqueue.container("outer") as outer:
        done_child = jobqueue.enqueue("wf.step", parent=outer)
        run_burst()
        with jobqueue.container("inner", parent=outer) as inner:
            deep = jobqueue.enqueue("wf.step", parent=inner)
        ready_child = jobqueue.enqueue("wf.step", parent=outer)
        waiting_child = jobqueue.enqueue("wf.step", parent=outer, depends_on=[ready_child])
    after = jobqueue.enqueue("wf.step", depends_on=[outer])
    outside = jobqueue.enqueue("wf.step", depends_on=[deep])
    assert jobqueue.cancel(outer) is True
    assert states(outer, done_child, inner, deep, ready_child, waiting_child, after, outside) == (
        "cancelled", "done", "cancelled", "cancelled", "cancelled", "cancelled", "cancelled",
        "cancelled",
    )  # fmt: skip
    assert after.cancelled_by_id == outer.pk
    assert outside.cancelled_by_id == deep.pk
    run_burst()
    assert list(RunRecord.objects.values_list("job_id", flat=True)) == [done_child.pk]


# -- unique keys -------------------------------------------------------------------------------


def test_unique_key_returns_the_unfinished_job_and_frees_the_key_when_final():
    a = jobqueue.enqueue("test.noop", unique_key="k1")
    b = jobqueue.enqueue("test.noop", unique_key="k1")
    other = jobqueue.enqueue("test.noop", unique_key="k2")
    assert a.pk == b.pk != other.pk
    c = jobqueue.enqueue("test.noop", depends_on=[a])
    assert jobqueue.cancel(a) is True
    assert states(a, c) == ("cancelled", "cancelled")
    d = jobqueue.enqueue("test.noop", unique_key="k1")
    assert d.pk != a.pk
    run_burst()
    assert states(d) == ("done",)
    e = jobqueue.enqueue("test.noop", unique_key="k1")
    assert e.pk not in (a.pk, d.pk)
    assert Job.objects.filter(unique_key="k1").exclude(state__in=Job.TERMINAL_STATES).count() == 1
    # Retrying a job whose key another unfinished job holds now is refused.
    with pytest.raises(InvalidJobError, match="unique key"):
        jobqueue.retry(a)


def test_unique_key_is_a_database_constraint():
    jobqueue.enqueue("test.noop", unique_key="dup")
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.create(type="test.noop", unique_key="dup")  # unique_slot defaults to 1
    # Finished jobs hold no slot, so any number of them may share the key.
    Job.objects.filter(unique_key="dup").update(unique_slot=None)
    Job.objects.create(type="test.noop", unique_key="dup")
    assert Job.objects.filter(unique_key="dup").count() == 2


# -- graph builder -----------------------------------------------------------------------------


def test_graph_builder_writes_containers_and_edges_and_runs():
    with jobqueue.graph() as g:
        box = g.container("big")
        first = [g.add("test.add", {"a": i, "b": 1}, parent=box) for i in range(50)]
        total = g.add("test.upstream_sum", depends_on=first)
        after_box = g.add("test.noop", depends_on=[box])
    assert Job.objects.count() == 53
    assert JobDependency.objects.count() == 51
    assert all(j.pk for j in [box, total, after_box, *first])
    run_burst(4)
    assert set(Job.objects.values_list("state", flat=True)) == {"done"}
    assert states(total) == ("done",) and total.result == sum(i + 1 for i in range(50))
    jobs = jobqueue.enqueue_many([("test.noop", {})] * 10)
    assert len(jobs) == 10 and all(j.pk and j.state == "ready" for j in jobs)


def test_graph_container_takes_queue_as_container_does():
    # Both builders give the container row the queue and group they are given; its children
    # take their own (the default queue when none is given).
    with jobqueue.container("open", group="g", queue="emails") as open_box:
        open_child = jobqueue.enqueue("test.noop", parent=open_box)
    with jobqueue.graph() as g:
        box = g.container("graphed", group="g", queue="emails")
        child = g.add("test.noop", parent=box)
        default_box = g.container("default")
    rows = Job.objects.in_bulk([open_box.pk, open_child.pk, box.pk, child.pk, default_box.pk])
    assert (rows[box.pk].queue, rows[box.pk].group_key) == ("emails", "g")
    assert (rows[open_box.pk].queue, rows[open_box.pk].group_key) == ("emails", "g")
    assert rows[child.pk].queue == rows[open_child.pk].queue == "default"
    assert rows[default_box.pk].queue == "default"
    with pytest.raises(InvalidJobError, match="queue"), jobqueue.graph() as g:
        g.container("bad", queue="")
    assert Job.objects.count() == 5


def test_graph_of_ten_thousand_jobs_is_written_in_one_transaction():
    containers, per_container = 99, 100
    with CaptureQueriesContext(connection) as queries, jobqueue.graph() as g:
        root = g.add("test.noop")
        outer = g.container("outer")
        boxes = [g.container(f"part {i}", parent=outer) for i in range(containers)]
        leaves = [
            g.add("test.noop", parent=box, depends_on=[root])
            for box in boxes
            for _ in range(per_container)
        ]
        sink = g.add("test.noop", depends_on=[outer, root])
    total = 1 + 1 + containers + containers * per_container + 1
    assert total == 10_002
    assert Job.objects.count() == total
    assert JobDependency.objects.count() == len(leaves) + 2
    assert JobDependency.objects.filter(depends_on=root).count() == len(leaves) + 1
    assert Job.objects.filter(parent=outer).count() == containers
    assert Job.objects.filter(parent__parent=outer).count() == containers * per_container
    by_state = Job.objects.values_list("state").annotate(n=Count("pk")).order_by()
    assert dict(by_state) == {"ready": 1, "waiting": total - 1}
    assert states(root, sink) == ("ready", "waiting")
    assert all(job.pk for job in leaves)
    if connection.features.can_return_rows_from_bulk_insert:
        # Bulk INSERTs of up to 500 jobs and 1000 edges, a few reads: far fewer statements than
        # rows. A database's cap on query parameters can make the batches smaller (SQLite under
        # Django 5.2 allows 999 per query), so the bound follows the backend's batch size.
        fields = [f for f in Job._meta.concrete_fields if not f.primary_key]
        job_batch = min(500, connection.ops.bulk_batch_size(fields, leaves))
        bound = 40 + -(-total // job_batch) + -(-total // min(1000, job_batch * len(fields) // 2))
        assert len(queries) < bound, (len(queries), bound)
        assert len(queries) < total // 10
