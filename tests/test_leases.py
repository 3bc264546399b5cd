"""The lease protocol, driven directly: claims are exclusive and a reclaimed attempt is fenced."""

from __future__ import annotations

import dataclasses
import datetime as dt
import sqlite3
import threading

import pytest
from django.db import connection, connections
from django.utils import timezone

import django_jobqueue as jobqueue
from django_jobqueue import conf, leases, maintenance
from django_jobqueue.dialects import get_dialect
from django_jobqueue.execution import InFlight, record_failure
from django_jobqueue.models import Job
from django_jobqueue.scheduling import Scheduler

pytestmark = pytest.mark.django_db(transaction=True)

TTL = 30.0


@pytest.fixture
def dialect():
    return get_dialect("default")


def claim_one(dialect, owner: str) -> leases.Lease:
    [job] = leases.claim(dialect, owner=owner, queues=[], limit=1, lease_ttl=TTL)
    return leases.Lease(job.pk, owner, job.attempts)


def expire_and_reclaim(dialect, job_id: int) -> None:
    """Push the lease deadline into the past, sweep it, and make the retry runnable now."""
    Job.objects.filter(pk=job_id).update(lease_expires=timezone.now() - dt.timedelta(hours=1))
    moved = maintenance.reclaim_expired(dialect, batch=10, backoff=0.01, backoff_max=0.01)
    assert moved == [(job_id, Job.State.READY)]
    Job.objects.filter(pk=job_id).update(run_after=None)


def snapshot(job_id: int) -> dict:
    return Job.objects.filter(pk=job_id).values().get()


def test_claim_increments_attempts_and_records_the_owner(dialect):
    job = jobqueue.enqueue("test.noop")
    lease = claim_one(dialect, "w1")
    assert lease == leases.Lease(job.pk, "w1", 1)
    row = Job.objects.get(pk=job.pk)
    assert row.state == Job.State.LEASED
    assert row.lease_owner == "w1"
    assert row.attempts == 1
    assert row.lease_expires > timezone.now() + dt.timedelta(seconds=TTL / 2)


def test_claim_skips_jobs_that_are_not_ready(dialect):
    jobqueue.enqueue("test.noop", run_after=dt.timedelta(hours=1))
    upstream = jobqueue.enqueue("test.noop")
    jobqueue.enqueue("test.noop", depends_on=[upstream])
    claimed = leases.claim(dialect, owner="w1", queues=[], limit=10, lease_ttl=TTL)
    assert [j.pk for j in claimed] == [upstream.pk]


def test_claim_respects_queues_and_priority(dialect):
    low = jobqueue.enqueue("test.noop", queue="a", priority=0)
    high = jobqueue.enqueue("test.noop", queue="a", priority=5)
    jobqueue.enqueue("test.noop", queue="b", priority=9)
    claimed = leases.claim(dialect, owner="w1", queues=["a"], limit=10, lease_ttl=TTL)
    assert [j.pk for j in claimed] == [high.pk, low.pk]


def test_two_workers_never_claim_the_same_job(dialect):
    ids = {jobqueue.enqueue("test.noop").pk for _ in range(5)}
    first = leases.claim(dialect, owner="w1", queues=[], limit=3, lease_ttl=TTL)
    second = leases.claim(dialect, owner="w2", queues=[], limit=3, lease_ttl=TTL)
    assert len(first) == 3
    assert len(second) == 2
    assert {j.pk for j in first} | {j.pk for j in second} == ids
    assert not {j.pk for j in first} & {j.pk for j in second}
    assert leases.claim(dialect, owner="w3", queues=[], limit=3, lease_ttl=TTL) == []


@pytest.mark.parametrize("fair_share", [False, True], ids=["plain", "fair-share-groups"])
def test_concurrent_claims_from_threads_are_disjoint(fair_share):
    """Threads (each its own connection) race claim() until the queue is empty; with several
    groups the claim goes through the fair-share scheduler's per-group locking reads."""
    groups = ["a", "b", "c"] if fair_share else [""]
    ids = {
        jobqueue.enqueue("test.noop", group=groups[i % len(groups)], weight=1 + i % 3).pk
        for i in range(120)
    }
    claimed: dict[str, list[int]] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def run(owner: str) -> None:
        dialect = get_dialect("default")
        scheduler = Scheduler(conf.get()) if fair_share else None
        mine: list[int] = []
        try:
            barrier.wait()
            while batch := leases.claim(
                dialect, owner=owner, queues=[], limit=3, lease_ttl=TTL, scheduler=scheduler
            ):
                mine.extend(j.pk for j in batch)
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            claimed[owner] = mine
            connections.close_all()

    threads = [threading.Thread(target=run, args=(f"w{i}",)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    everything = [pk for mine in claimed.values() for pk in mine]
    assert len(everything) == len(set(everything)) == len(ids)
    assert set(everything) == ids
    owners = dict(Job.objects.values_list("pk", "lease_owner"))
    for owner, mine in claimed.items():
        assert all(owners[pk] == owner for pk in mine)


def test_start_renew_finish_work_under_a_current_lease(dialect):
    job = jobqueue.enqueue("test.noop")
    lease = claim_one(dialect, "w1")
    before = Job.objects.get(pk=job.pk).lease_expires
    assert leases.start(dialect, lease) is True
    assert Job.objects.get(pk=job.pk).state == Job.State.RUNNING
    assert leases.renew(dialect, [lease], lease_ttl=TTL * 10) == 1
    assert Job.objects.get(pk=job.pk).lease_expires > before
    assert leases.finish(dialect, lease, {"answer": 42}) == "done"
    row = Job.objects.get(pk=job.pk)
    assert row.state == Job.State.DONE
    assert row.result == {"answer": 42}
    assert row.lease_owner is None
    assert row.lease_expires is None
    assert row.finished_at is not None


@pytest.mark.parametrize("same_owner", [True, False], ids=["same-owner", "other-owner"])
def test_reclaimed_attempt_is_fenced_off(dialect, same_owner):
    """After expiry, reclaim and a new claim, the old lease's writes change nothing.

    With the same owner name only the generation (attempt) tells the leases apart, which is
    what protects a worker that lost a lease and claimed the same job again.
    """
    job = jobqueue.enqueue("test.noop", max_attempts=5)
    old = claim_one(dialect, "w1")
    assert leases.start(dialect, old)
    expire_and_reclaim(dialect, job.pk)
    reclaimed = Job.objects.get(pk=job.pk)
    assert reclaimed.state == Job.State.READY
    assert reclaimed.attempts == 1  # the crashed attempt stays charged
    assert reclaimed.last_error["type"] == "django_jobqueue.exceptions.LeaseExpired"

    new = claim_one(dialect, "w1" if same_owner else "w2")
    assert new.attempt == old.attempt + 1
    assert leases.start(dialect, new)
    current = snapshot(job.pk)

    # Every write of the old generation is refused and leaves the row exactly as it was.
    assert leases.start(dialect, old) is False
    assert leases.renew(dialect, [old], lease_ttl=TTL * 10) == 0
    assert leases.finish(dialect, old, "stale") is None
    assert leases.fail(dialect, old, {"type": "x"}, dead=True) is None
    assert leases.fail(dialect, old, {"type": "x"}, retry_in=0) is None
    assert leases.release(dialect, [old]) == 0
    assert snapshot(job.pk) == current

    # The new generation still works, and the old one cannot touch the finished job either.
    assert leases.renew(dialect, [new, old], lease_ttl=TTL) == 1
    assert leases.finish(dialect, new, "fresh") == "done"
    finished = snapshot(job.pk)
    assert finished["state"] == Job.State.DONE
    assert finished["result"] == "fresh"
    assert leases.finish(dialect, old, "stale") is None
    assert leases.fail(dialect, old, {"type": "x"}, dead=True) is None
    assert snapshot(job.pk) == finished


def test_late_finish_after_reclaim_without_a_new_claim_changes_nothing(dialect):
    job = jobqueue.enqueue("test.noop")
    old = claim_one(dialect, "w1")
    expire_and_reclaim(dialect, job.pk)
    ready = snapshot(job.pk)
    assert leases.finish(dialect, old, "late") is None
    assert leases.start(dialect, old) is False
    assert snapshot(job.pk) == ready
    assert ready["state"] == Job.State.READY
    assert ready["result"] is None


def test_release_returns_the_job_to_ready_without_charging_the_attempt(dialect):
    job = jobqueue.enqueue("test.noop")
    lease = claim_one(dialect, "w1")
    assert leases.start(dialect, lease)
    assert leases.release(dialect, [lease]) == 1
    row = Job.objects.get(pk=job.pk)
    assert row.state == Job.State.READY
    assert row.attempts == 0
    assert row.lease_owner is None
    assert row.lease_expires is None
    assert leases.release(dialect, [lease]) == 0  # a released lease is gone
    again = claim_one(dialect, "w2")
    assert again.attempt == 1


def test_reclaim_ignores_live_leases_and_kills_exhausted_jobs(dialect):
    live = jobqueue.enqueue("test.noop")
    claim_one(dialect, "w1")
    last = jobqueue.enqueue("test.noop", max_attempts=1)
    claim_one(dialect, "w2")
    Job.objects.filter(pk=last.pk).update(lease_expires=timezone.now() - dt.timedelta(hours=1))
    moved = maintenance.reclaim_expired(dialect, batch=10, backoff=0.01, backoff_max=0.01)
    assert moved == [(last.pk, Job.State.DEAD)]
    dead = Job.objects.get(pk=last.pk)
    assert dead.state == Job.State.DEAD
    assert dead.finished_at is not None
    assert dead.last_error["type"] == "django_jobqueue.exceptions.LeaseExpired"
    assert Job.objects.get(pk=live.pk).state == Job.State.LEASED


def test_reclaim_backs_off_before_the_retry(dialect):
    job = jobqueue.enqueue("test.noop")
    claim_one(dialect, "w1")
    Job.objects.filter(pk=job.pk).update(lease_expires=timezone.now() - dt.timedelta(hours=1))
    maintenance.reclaim_expired(dialect, batch=10, backoff=60, backoff_max=60)
    row = Job.objects.get(pk=job.pk)
    assert row.state == Job.State.READY
    assert row.run_after - row.updated_at >= dt.timedelta(seconds=44)  # 60s -25% jitter
    assert leases.claim(dialect, owner="w2", queues=[], limit=1, lease_ttl=TTL) == []


def test_backoff_is_exponential_capped_and_jittered():
    for attempt, base in [(1, 2.0), (2, 4.0), (3, 8.0), (4, 16.0)]:
        delays = [leases.backoff_seconds(attempt, 2.0, 100.0) for _ in range(200)]
        assert all(0.75 * base <= d <= 1.25 * base for d in delays)
        assert len(set(delays)) > 1
    assert all(leases.backoff_seconds(30, 2.0, 10.0) <= 12.5 for _ in range(100))


def test_failed_attempt_is_retried_after_a_backoff_by_the_database_clock(dialect):
    job = jobqueue.enqueue("test.fail", max_attempts=3)
    lease = claim_one(dialect, "w1")
    [claimed] = Job.objects.filter(pk=job.pk)
    flight = InFlight(job=claimed, lease=lease, started=0.0, deadline=None)
    settings = jobqueue_conf(retry_backoff=10.0, retry_backoff_max=100.0)
    record_failure(dialect, settings, flight, RuntimeError("nope"))
    row = Job.objects.get(pk=job.pk)
    assert row.state == Job.State.READY
    assert row.lease_owner is None
    delay = (row.run_after - row.updated_at).total_seconds()
    assert 7.5 <= delay <= 12.5
    assert row.last_error["type"] == "builtins.RuntimeError"
    assert row.last_error["message"] == "nope"
    assert row.last_error["attempt"] == 1


def jobqueue_conf(**overrides):
    return dataclasses.replace(conf.get(), **overrides)


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's database write lock")
def test_sqlite_claim_transaction_holds_the_write_lock_from_its_first_read(dialect):
    """Even when the project leaves transaction_mode unset (DEFERRED) and the connection is
    closed, the claim transaction begins IMMEDIATE: another writer is shut out before the read.
    """
    options = connection.settings_dict["OPTIONS"]
    saved = dict(options)
    options.pop("transaction_mode", None)
    connection.close()
    seen: list[str] = []

    def probe() -> None:
        other = sqlite3.connect(connection.settings_dict["NAME"], timeout=0)
        try:
            other.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            seen.append(str(exc))
        else:
            other.rollback()
        finally:
            other.close()

    try:
        dialect.run_in_transaction(probe)
    finally:
        options.clear()
        options.update(saved)
        connection.close()
    assert seen == ["database is locked"]


def test_backoff_of_a_very_late_attempt_stays_capped() -> None:
    # 2 ** 1024 overflows a float: the exponent must be capped before the power.
    assert leases.backoff_seconds(5000, base=2.0, cap=3600.0) <= 3600.0 * 1.25
    assert leases._seconds(float("1e300")).days == 3650
