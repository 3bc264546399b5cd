"""The dialect contract: the finish of a batch of leases."""

from __future__ import annotations

import json

import pytest

from django_jobqueue.engine import leases
from django_jobqueue.models import Job
from django_jobqueue.worker.reclaimer import reclaim_expired
from tests.support.dialect_contract import (
    DIALECT,
    claim,
    expire,
    row,
)
from tests.support.factories import JobFactory

# Claims and finishes commit (and one test uses a second connection): no wrapping transaction.
pytestmark = pytest.mark.django_db(transaction=True)


def test_finish_records_the_result_and_ends_the_lease(dialect, finish_by):
    plain, answered, cancelled = (JobFactory() for _ in range(3))
    claimed = {j.id: j for j in claim(dialect)}
    Job.objects.filter(pk=cancelled.pk).update(cancel_requested=True)
    texts = {plain.pk: None, answered.pk: json.dumps({"answer": 42}), cancelled.pk: '"x"'}
    items = [(pk, claimed[pk].attempts, texts[pk]) for pk in texts]
    before = dialect.now()
    report = finish_by(dialect, "w1", items)
    after = dialect.now()
    assert sorted((f.job_id, f.state) for f in report.finished) == [
        (plain.pk, Job.State.DONE),
        (answered.pk, Job.State.DONE),
        (cancelled.pk, Job.State.CANCELLED),
    ]
    assert (report.lost, report.busy, report.recorded) == ([], [], [])
    results = {plain.pk: None, answered.pk: {"answer": 42}, cancelled.pk: None}
    for pk, result in results.items():
        stored = row(pk)
        assert stored["result"] == result  # a cancelled job's result is discarded
        assert (stored["lease_owner"], stored["lease_expires"], stored["unique_slot"]) == (
            None,
            None,
            None,
        )
        assert before <= stored["finished_at"] <= after


def test_finish_is_fenced_by_owner_and_generation(dialect, finish_by):
    job = JobFactory()
    [claimed] = claim(dialect, owner="w1")
    untouched = row(job.pk)
    for owner, attempt in (("w2", claimed.attempts), ("w1", claimed.attempts + 1)):
        report = finish_by(dialect, owner, [(job.pk, attempt, '"wrong"')])
        assert report.finished == [] and report.lost == [job.pk], (owner, attempt)
        assert row(job.pk) == untouched
    report = finish_by(dialect, "w1", [(job.pk, claimed.attempts, '"right"')])
    assert [(f.job_id, f.state) for f in report.finished] == [(job.pk, Job.State.DONE)]
    assert row(job.pk)["result"] == "right"


def test_finish_of_a_lost_lease_changes_nothing(dialect, finish_by):
    """A lease reclaimed from its worker (and claimed again by another) is lost to the first:
    its finish is reported lost and leaves the row exactly as the new lease has it."""
    job = JobFactory()
    [old] = claim(dialect, owner="w1")
    expire(job.pk, dialect)
    assert reclaim_expired(dialect, batch=10) == [(job.pk, Job.State.SCHEDULED)]
    reclaimed = row(job.pk)
    report = finish_by(dialect, "w1", [(job.pk, old.attempts, '"late"')])
    assert (report.finished, report.lost) == ([], [job.pk])
    assert row(job.pk) == reclaimed
    Job.objects.filter(pk=job.pk).update(state=Job.State.READY, run_after=None)
    [new] = claim(dialect, owner="w2")
    assert new.attempts == old.attempts + 1
    current = row(job.pk)
    report = finish_by(dialect, "w1", [(job.pk, old.attempts, '"late"')])
    assert (report.finished, report.lost) == ([], [job.pk])
    assert row(job.pk) == current


def test_finish_repeated_by_the_same_lease_is_reported_recorded(dialect, finish_by):
    """A finish whose commit went through but whose reply was lost is retried: the retry finds
    its own work done (recorded), not a lost lease, and writes nothing again."""
    job = JobFactory()
    [claimed] = claim(dialect, owner="w1")
    items = [(job.pk, claimed.attempts, '"once"')]
    assert [f.job_id for f in finish_by(dialect, "w1", items).finished] == [job.pk]
    done = row(job.pk)
    report = finish_by(dialect, "w1", items)
    assert (report.finished, report.lost, report.recorded) == ([], [], [(job.pk, "done")])
    assert row(job.pk) == done


@pytest.mark.skipif(
    not DIALECT.autocommit_statements,
    reason="autocommit_statements is False: every finish takes the full transaction",
)
def test_finish_simple_leaves_the_jobs_whose_graph_must_react(dialect):
    """The autocommit finish takes only jobs nothing depends on and outside any container: the
    others need the graph's reaction in their transaction, so finish_many() takes them."""
    container = JobFactory(state=Job.State.WAITING)
    simple, upstream, child = (
        JobFactory(),
        JobFactory(has_dependents=True),
        JobFactory(parent=container),
    )
    claimed = {j.id: j for j in claim(dialect)}
    assert set(claimed) == {simple.pk, upstream.pk, child.pk}
    items = [(pk, j.attempts, None) for pk, j in claimed.items()]
    done = dialect.run_statement(lambda: dialect.finish_simple(owner="w1", items=items))
    assert [(f.job_id, f.state) for f in done] == [(simple.pk, Job.State.DONE)]
    assert row(upstream.pk)["state"] == row(child.pk)["state"] == Job.State.RUNNING
    report = leases.finish_many(dialect, "w1", items)
    assert sorted(f.job_id for f in report.finished) == sorted([upstream.pk, child.pk])
    assert report.recorded == [(simple.pk, "done")]
