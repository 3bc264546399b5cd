"""The dialect contract: reclaim, release and renewal of leases."""

from __future__ import annotations

import datetime as dt

import pytest

from django_jobqueue.engine import leases
from django_jobqueue.models import Job, Worker
from django_jobqueue.worker.reclaimer import reclaim_expired
from tests.support.dialect_contract import (
    TTL,
    claim,
    expire,
    register,
    row,
)
from tests.support.factories import JobFactory

# Claims and finishes commit (and one test uses a second connection): no wrapping transaction.
pytestmark = pytest.mark.django_db(transaction=True)


def test_reclaim_takes_back_only_expired_leases_of_gone_owners(dialect):
    """An expired lease comes back (scheduled, charged, with a LeaseExpired error) when its
    owner has no live row or no longer lists the job; a live owner that lists it keeps it,
    and an unexpired lease is never touched."""
    jobs = {name: JobFactory(max_attempts=5) for name in ("gone", "dead", "forgot", "kept", "live")}
    owners = {"gone": "w-gone", "dead": "w-dead", "forgot": "w-forgot", "kept": "w-kept"}
    owners["live"] = "w-live"
    for name, job in jobs.items():
        [claimed] = leases.claim(dialect, owner=owners[name], queues=[], limit=1, lease_ttl=TTL)
        assert claimed.id == job.pk
    register(dialect, "w-dead", alive=False, job_ids=[jobs["dead"].pk])
    register(dialect, "w-forgot", alive=True, job_ids=[])
    register(dialect, "w-kept", alive=True, job_ids=[jobs["kept"].pk])
    for name in ("gone", "dead", "forgot", "kept"):
        expire(jobs[name].pk, dialect)
    live = row(jobs["live"].pk)
    before = dialect.now()
    moved = reclaim_expired(dialect, batch=10)
    taken = [jobs[name].pk for name in ("gone", "dead", "forgot")]
    assert sorted(moved) == sorted((pk, Job.State.SCHEDULED) for pk in taken)
    for pk in taken:
        stored = row(pk)
        assert (stored["state"], stored["lease_owner"], stored["attempts"]) == (
            Job.State.SCHEDULED,
            None,
            1,
        )
        assert stored["last_error"]["type"] == "django_jobqueue.exceptions.LeaseExpired"
        assert stored["last_error"]["attempt"] == 1
        assert before <= stored["run_after"] <= dialect.now()  # due at once: no retry backoff
    kept = row(jobs["kept"].pk)
    assert (kept["state"], kept["lease_owner"]) == (Job.State.RUNNING, "w-kept")
    assert kept["lease_expires"] == Worker.objects.get(pk="w-kept").expires_at
    assert row(jobs["live"].pk) == live


def test_reclaim_ends_a_job_whose_attempts_are_spent_or_whose_cancel_was_asked(dialect):
    spent = JobFactory(max_attempts=1)
    asked = JobFactory(max_attempts=5)
    claim(dialect, owner="w-gone")
    Job.objects.filter(pk=asked.pk).update(cancel_requested=True)
    for job in (spent, asked):
        expire(job.pk, dialect)
    moved = reclaim_expired(dialect, batch=10)
    assert sorted(moved) == sorted([(spent.pk, Job.State.DEAD), (asked.pk, Job.State.CANCELLED)])
    for job in (spent, asked):
        stored = row(job.pk)
        assert stored["finished_at"] is not None
        assert (stored["lease_owner"], stored["unique_slot"]) == (None, None)


def test_reclaim_takes_at_most_batch_oldest_expiry_first(dialect):
    jobs = [JobFactory() for _ in range(3)]
    claim(dialect, owner="w-gone")
    now = dialect.now()
    for hours, job in zip((1, 3, 2), jobs, strict=True):
        Job.objects.filter(pk=job.pk).update(lease_expires=now - dt.timedelta(hours=hours))
    moved = reclaim_expired(dialect, batch=2)
    assert [pk for pk, _ in moved] == [jobs[1].pk, jobs[2].pk]
    assert row(jobs[0].pk)["state"] == Job.State.RUNNING


def test_release_hands_back_without_charging_an_attempt(dialect):
    """A released job is ready again with the attempt uncharged; one whose cancellation was
    asked ends cancelled; a lease of another generation releases nothing."""
    back, doomed, other = JobFactory(attempts=2, max_attempts=5), JobFactory(), JobFactory()
    claimed = {j.id: j for j in claim(dialect, owner="w1")}
    Job.objects.filter(pk=doomed.pk).update(cancel_requested=True)
    lease = {pk: leases.Lease(pk, "w1", j.attempts) for pk, j in claimed.items()}
    stale = leases.Lease(other.pk, "w1", claimed[other.pk].attempts - 1)
    assert leases.release(dialect, [stale]) == 0
    running = row(other.pk)
    assert leases.release(dialect, [lease[back.pk], lease[doomed.pk]]) == 2
    stored = row(back.pk)
    assert (stored["state"], stored["attempts"], stored["lease_owner"]) == (
        Job.State.READY,
        2,
        None,
    )
    assert stored["lease_expires"] is None
    assert row(doomed.pk)["state"] == Job.State.CANCELLED
    assert row(other.pk) == running
    assert leases.release(dialect, [lease[back.pk]]) == 0  # a released lease is gone
    [again] = claim(dialect, owner="w2")
    assert (again.id, again.attempts) == (back.pk, 3)


def test_renewal_pushes_back_only_current_leases(dialect):
    mine, stale, theirs = (JobFactory() for _ in range(3))
    claim(dialect, owner="w1", limit=2)
    claim(dialect, owner="w2", limit=1)
    assert row(theirs.pk)["lease_owner"] == "w2"
    untouched = {pk: row(pk) for pk in (stale.pk, theirs.pk)}
    current = leases.Lease(mine.pk, "w1", 1)
    before = dialect.now()
    held = leases.renew_leases(
        dialect,
        [current, leases.Lease(stale.pk, "w1", 2), leases.Lease(theirs.pk, "w1", 1)],
        TTL * 10,
    )
    after = dialect.now()
    assert held == 1
    stored = row(mine.pk)
    longer = dt.timedelta(seconds=TTL * 10)
    assert before + longer <= stored["lease_expires"] <= after + longer
    assert before <= stored["heartbeat_at"] <= after
    assert {pk: row(pk) for pk in untouched} == untouched
