"""An outcome whose COMMIT went through but whose reply was lost is recorded, not "lost".

A lost commit reply cannot be produced on demand against a real server, so these tests drive
what follows it: the completer writes the same batch (or the same failure) again, and finds
the rows finished (or failed) by that very lease. A lease that was reclaimed before its write
stays lost, whoever claimed the job since.
"""

from __future__ import annotations

import datetime as dt
import logging

import pytest
from django.utils import timezone

import django_jobqueue as jobqueue
from django_jobqueue import conf, signals
from django_jobqueue.dialects import get_dialect
from django_jobqueue.engine import leases, staging
from django_jobqueue.engine.attempts import InFlight, Outcome, failure_plan
from django_jobqueue.engine.error_records import error_info, error_record
from django_jobqueue.models import Job
from django_jobqueue.worker.completer import Completer
from django_jobqueue.worker.flights import Flights
from django_jobqueue.worker.reclaimer import reclaim_expired

pytestmark = pytest.mark.django_db(transaction=True)

TTL = 30.0


@pytest.fixture
def dialect():
    return get_dialect("default")


def claim_one(dialect, owner: str) -> leases.Lease:
    [job] = leases.claim(dialect, owner=owner, queues=[], limit=1, lease_ttl=TTL)
    return leases.Lease(job.pk, owner, job.attempts)


def expire(dialect, job_id: int, *, runnable: bool = True) -> None:
    Job.objects.filter(pk=job_id).update(lease_expires=timezone.now() - dt.timedelta(hours=1))
    reclaim_expired(dialect, batch=10)
    if runnable:
        Job.objects.filter(pk=job_id).update(run_after=None, state=Job.State.READY)


def test_a_batch_written_again_after_its_commit_finds_its_rows_recorded(dialect):
    job = jobqueue.enqueue("test.noop")
    lease = claim_one(dialect, "w1")
    items = [(job.pk, lease.attempt, '"answer"')]
    first = leases.finish_many(dialect, "w1", items)
    assert [f.job_id for f in first.finished] == [job.pk]
    again = leases.finish_many(dialect, "w1", items)  # the completer's retry
    assert again.lost == []
    assert again.recorded == [(job.pk, "done")]
    assert again.finished == []  # the graph reacted in the first commit, not again
    assert leases.finish(dialect, lease, "answer") == "done"


def test_a_cancelled_finish_written_again_is_recorded_cancelled(dialect):
    job = jobqueue.enqueue("test.noop")
    lease = claim_one(dialect, "w1")
    jobqueue.cancel(job.pk)
    assert leases.finish(dialect, lease, None) == "cancelled"
    assert dialect.finished_by("w1", {job.pk: lease.attempt}) == {job.pk: "cancelled"}


def test_a_row_reclaimed_and_finished_by_another_worker_is_lost(dialect):
    job = jobqueue.enqueue("test.noop", max_attempts=3)
    old = claim_one(dialect, "w1")
    expire(dialect, job.pk)
    new = claim_one(dialect, "w2")
    assert leases.finish(dialect, new, "theirs") == "done"
    report = leases.finish_many(dialect, "w1", [(job.pk, old.attempt, None)])
    assert report.lost == [job.pk]
    assert report.recorded == []
    assert dialect.finished_by("w1", {job.pk: old.attempt}) == {}


def test_a_row_reclaimed_and_finished_by_the_same_owner_again_is_lost(dialect):
    job = jobqueue.enqueue("test.noop", max_attempts=3)
    old = claim_one(dialect, "w1")
    expire(dialect, job.pk)
    new = claim_one(dialect, "w1")
    assert leases.finish(dialect, new, "later") == "done"
    assert leases.finish_many(dialect, "w1", [(job.pk, old.attempt, None)]).lost == [job.pk]


def test_a_row_that_died_or_was_cancelled_on_reclaim_is_lost(dialect):
    dead = jobqueue.enqueue("test.noop", max_attempts=1)
    lease = claim_one(dialect, "w1")
    expire(dialect, dead.pk, runnable=False)
    assert Job.objects.get(pk=dead.pk).state == Job.State.DEAD
    cancelled = jobqueue.enqueue("test.noop", max_attempts=3)
    other = claim_one(dialect, "w1")
    jobqueue.cancel(cancelled.pk)
    expire(dialect, cancelled.pk, runnable=False)
    assert Job.objects.get(pk=cancelled.pk).state == Job.State.CANCELLED
    wanted = {dead.pk: lease.attempt, cancelled.pk: other.attempt}
    assert dialect.finished_by("w1", wanted) == {}


def test_the_completer_sends_job_finished_for_a_row_its_earlier_write_finished(dialect):
    job = jobqueue.enqueue("test.noop")
    lease = claim_one(dialect, "w1")
    [row] = Job.objects.filter(pk=job.pk)
    flights = Flights()
    flight = InFlight(job=row, lease=lease, claimed=0.0)
    flights.add(flight)
    completer = Completer(dialect, conf=conf.get(), owner="w1", flights=flights, lock_timeout=5.0)
    assert leases.finish(dialect, lease, 7) == "done"  # committed; the reply was "lost"
    seen = []

    def receiver(sender, **kwargs):
        seen.append((kwargs["job_id"], kwargs["state"], kwargs["result"]))

    signals.job_finished.connect(receiver)
    try:
        assert completer._finish([Outcome(flight, result=7, text="7")]) == []
    finally:
        signals.job_finished.disconnect(receiver)
    assert seen == [(job.pk, "done", 7)]
    assert flight.recorded
    assert len(flights) == 0


# -- failures ---------------------------------------------------------------------------------


def boom(attempt: int) -> dict:
    return error_record("builtins.ValueError", "boom", attempt, traceback="Traceback ...")


def history(job_id: int) -> dict:
    return Job.objects.filter(pk=job_id).values("state", "attempts", "errors", "updated_at")[0]


@pytest.mark.parametrize(
    ("plan", "state"),
    [({"retry_in": 0}, "ready"), ({"retry_in": 60}, "scheduled"), ({"dead": True}, "dead")],
)
def test_a_failure_written_again_after_its_commit_returns_the_state_it_wrote(dialect, plan, state):
    job = jobqueue.enqueue("test.fail", max_attempts=3)
    lease = claim_one(dialect, "w1")
    assert leases.fail(dialect, lease, boom(lease.attempt), **plan) == state
    row = history(job.pk)
    assert leases.fail(dialect, lease, boom(lease.attempt), **plan) == state  # the retry
    assert history(job.pk) == row  # written once: one error in the history
    assert len(row["errors"]) == 1


def test_a_cancelled_failure_written_again_is_recorded_cancelled(dialect):
    job = jobqueue.enqueue("test.fail", max_attempts=3)
    lease = claim_one(dialect, "w1")
    jobqueue.cancel(job.pk)
    assert leases.fail(dialect, lease, boom(lease.attempt), retry_in=0) == "cancelled"
    assert leases.fail(dialect, lease, boom(lease.attempt), retry_in=0) == "cancelled"


def test_a_failure_written_again_after_its_retry_came_due_returns_scheduled(dialect):
    job = jobqueue.enqueue("test.fail", max_attempts=3)
    lease = claim_one(dialect, "w1")
    assert leases.fail(dialect, lease, boom(lease.attempt), retry_in=60) == "scheduled"
    Job.objects.filter(pk=job.pk).update(run_after=timezone.now() - dt.timedelta(seconds=1))
    assert staging.promote_due(dialect, batch=10) == 1
    assert leases.fail(dialect, lease, boom(lease.attempt), retry_in=60) == "scheduled"


@pytest.mark.parametrize("runnable", [False, True])
def test_a_failure_of_a_lease_reclaimed_before_it_was_written_is_lost(dialect, runnable):
    """Same attempt, same owner last, no claim since: only the reclaim's error tells."""
    job = jobqueue.enqueue("test.fail", max_attempts=3)
    lease = claim_one(dialect, "w1")
    expire(dialect, job.pk, runnable=runnable)
    row = history(job.pk)
    assert leases.fail(dialect, lease, boom(lease.attempt), retry_in=0) is None
    assert history(job.pk) == row


@pytest.mark.parametrize("then", ["fail", "finish"])
def test_a_failure_of_a_row_reclaimed_and_ended_by_another_worker_is_lost(dialect, then):
    job = jobqueue.enqueue("test.fail", max_attempts=3)
    old = claim_one(dialect, "w1")
    expire(dialect, job.pk)
    new = claim_one(dialect, "w2")
    if then == "fail":  # the very record the old lease writes, to the letter
        assert leases.fail(dialect, new, boom(old.attempt), retry_in=0) == "ready"
    else:
        assert leases.finish(dialect, new, "theirs") == "done"
    row = history(job.pk)
    assert leases.fail(dialect, old, boom(old.attempt), retry_in=0) is None
    assert history(job.pk) == row


def test_a_failure_of_a_lease_released_and_failed_by_another_worker_is_lost(dialect):
    """The attempt number is the old lease's again, and the error the same: the owner tells."""
    job = jobqueue.enqueue("test.fail", max_attempts=3)
    old = claim_one(dialect, "w1")
    assert leases.release(dialect, [old]) == 1
    new = claim_one(dialect, "w2")
    assert new.attempt == old.attempt
    assert leases.fail(dialect, new, boom(old.attempt), retry_in=0) == "ready"
    row = history(job.pk)
    assert leases.fail(dialect, old, boom(old.attempt), retry_in=0) is None
    assert history(job.pk) == row


@pytest.mark.parametrize("then", ["run", "fail", "release"])
def test_a_failure_of_a_row_reclaimed_and_claimed_again_by_the_same_owner_is_lost(dialect, then):
    job = jobqueue.enqueue("test.fail", max_attempts=3)
    old = claim_one(dialect, "w1")
    expire(dialect, job.pk)
    new = claim_one(dialect, "w1")
    if then == "fail":
        assert leases.fail(dialect, new, boom(old.attempt), retry_in=0) == "ready"
    elif then == "release":  # the attempt count is the old lease's again, w1 is last
        assert leases.release(dialect, [new]) == 1
        assert Job.objects.get(pk=job.pk).attempts == old.attempt
    row = history(job.pk)
    assert leases.fail(dialect, old, boom(old.attempt), retry_in=0) is None
    assert history(job.pk) == row


@pytest.mark.parametrize(("max_attempts", "state"), [(1, "dead"), (3, "scheduled")])
def test_the_completer_sends_job_failed_for_a_row_its_earlier_write_failed(
    dialect, caplog, max_attempts, state
):
    job = jobqueue.enqueue("test.fail", max_attempts=max_attempts)
    lease = claim_one(dialect, "w1")
    [row] = Job.objects.filter(pk=job.pk)
    flights = Flights()
    flight = InFlight(job=row, lease=lease, claimed=0.0)
    flights.add(flight)
    completer = Completer(dialect, conf=conf.get(), owner="w1", flights=flights, lock_timeout=5.0)
    try:
        raise ValueError("boom")
    except ValueError as exc:
        error = exc
    outcome = Outcome(flight, error=error)
    plan = failure_plan(outcome, conf.get())
    written = leases.fail(dialect, lease, error_info(error, lease.attempt), **plan)
    assert written == state  # committed; the reply was "lost"
    seen = []

    def failed(sender, **kwargs):
        seen.append(("failed", kwargs["job_id"], kwargs["state"]))

    def dead(sender, **kwargs):
        seen.append(("dead", kwargs["job_id"]))

    signals.job_failed.connect(failed)
    signals.job_dead.connect(dead)
    try:
        with caplog.at_level(logging.INFO, logger="django_jobqueue"):
            assert completer._finish([outcome]) == []
    finally:
        signals.job_failed.disconnect(failed)
        signals.job_dead.disconnect(dead)
    assert seen == [("failed", job.pk, state)] + ([("dead", job.pk)] if state == "dead" else [])
    assert "Lost the lease" not in caplog.text
    assert flight.recorded
    assert len(flights) == 0
    assert len(Job.objects.get(pk=job.pk).errors) == 1
