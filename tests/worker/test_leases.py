"""The lease protocol, driven directly: claims are exclusive and a reclaimed attempt is fenced."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import sqlite3
import threading

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

import django_jobqueue as jobqueue
from django_jobqueue import conf
from django_jobqueue.dialects import get_dialect
from django_jobqueue.dialects.base import seconds
from django_jobqueue.engine import leases
from django_jobqueue.engine.attempts import InFlight, Outcome, failure_plan
from django_jobqueue.engine.fair_selection import FairShare
from django_jobqueue.models import Job, Worker
from django_jobqueue.worker.heartbeat import renew_leases
from django_jobqueue.worker.reclaimer import reclaim_expired
from tests.conftest import in_new_thread
from tests.support.markers import needs_skip_locked, only_sqlite

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
    moved = reclaim_expired(dialect, batch=10)
    assert moved == [(job_id, Job.State.SCHEDULED)]
    Job.objects.filter(pk=job_id).update(run_after=None, state=Job.State.READY)


def renew(dialect, leases_, lease_ttl):
    return renew_leases(dialect, leases_, lease_ttl)


def snapshot(job_id: int) -> dict:
    return Job.objects.filter(pk=job_id).values().get()


def test_claim_increments_attempts_and_records_the_owner(dialect):
    job = jobqueue.enqueue("test.noop")
    lease = claim_one(dialect, "w1")
    assert lease == leases.Lease(job.pk, "w1", 1)
    row = Job.objects.get(pk=job.pk)
    assert row.state == Job.State.RUNNING  # marked running in the claim itself
    assert row.lease_owner == "w1"
    assert row.attempts == 1
    assert row.started_at is not None
    assert row.worker_ids == ["w1"]
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
    groups the claim goes through the fair share's per-group locking reads."""
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
        planner = FairShare(conf.get()) if fair_share else None
        mine: list[int] = []
        try:
            barrier.wait()
            while batch := leases.claim(
                dialect, owner=owner, queues=[], limit=3, lease_ttl=TTL, fair_share=planner
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


def test_renew_and_finish_work_under_a_current_lease(dialect):
    job = jobqueue.enqueue("test.noop")
    lease = claim_one(dialect, "w1")
    before = Job.objects.get(pk=job.pk).lease_expires
    assert renew(dialect, [lease], lease_ttl=TTL * 10) == 1
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
    expire_and_reclaim(dialect, job.pk)
    reclaimed = Job.objects.get(pk=job.pk)
    assert reclaimed.attempts == 1  # the crashed attempt stays charged
    assert reclaimed.last_error["type"] == "django_jobqueue.exceptions.LeaseExpired"

    new = claim_one(dialect, "w1" if same_owner else "w2")
    assert new.attempt == old.attempt + 1
    current = snapshot(job.pk)

    # Every write of the old generation is refused and leaves the row exactly as it was.
    assert renew(dialect, [old], lease_ttl=TTL * 10) == 0
    assert leases.finish(dialect, old, "stale") is None
    assert leases.fail(dialect, old, {"type": "x"}, dead=True) is None
    assert leases.fail(dialect, old, {"type": "x"}, retry_in=0) is None
    assert leases.release(dialect, [old]) == 0
    assert snapshot(job.pk) == current

    # The new generation still works, and the old one cannot touch the finished job either.
    assert renew(dialect, [new, old], lease_ttl=TTL) == 1
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
    assert renew(dialect, [old], lease_ttl=TTL) == 0
    assert snapshot(job.pk) == ready
    assert ready["state"] == Job.State.READY
    assert ready["result"] is None


def test_release_returns_the_job_to_ready_without_charging_the_attempt(dialect):
    job = jobqueue.enqueue("test.noop")
    lease = claim_one(dialect, "w1")
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
    moved = reclaim_expired(dialect, batch=10)
    assert moved == [(last.pk, Job.State.DEAD)]
    dead = Job.objects.get(pk=last.pk)
    assert dead.state == Job.State.DEAD
    assert dead.finished_at is not None
    assert dead.last_error["type"] == "django_jobqueue.exceptions.LeaseExpired"
    assert Job.objects.get(pk=live.pk).state == Job.State.RUNNING


def test_a_reclaimed_job_is_due_at_once_without_a_retry_backoff(dialect, settings):
    """Its worker died, which was not the job's fault: the attempt is charged, but the job is
    due at once, whatever RETRY_BACKOFF says, and the promoter makes it ready."""
    from django_jobqueue.engine.staging import promote_due

    settings.JOBQUEUE = {**settings.JOBQUEUE, "RETRY_BACKOFF": 60, "RETRY_BACKOFF_MAX": 60}
    job = jobqueue.enqueue("test.noop")
    claim_one(dialect, "w1")
    Job.objects.filter(pk=job.pk).update(lease_expires=timezone.now() - dt.timedelta(hours=1))
    reclaim_expired(dialect, batch=10)
    row = Job.objects.get(pk=job.pk)
    assert (row.state, row.attempts) == (Job.State.SCHEDULED, 1)
    assert row.run_after <= dialect.now()
    promote_due(dialect, batch=10)
    [again] = leases.claim(dialect, owner="w2", queues=[], limit=1, lease_ttl=TTL)
    assert again.id == job.pk


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
    flight = InFlight(job=claimed, lease=lease, claimed=0.0)
    settings = jobqueue_conf(retry_backoff=10.0, retry_backoff_max=100.0)
    outcome = Outcome(flight, error=RuntimeError("nope"))
    from django_jobqueue.engine.error_records import error_info

    plan = failure_plan(outcome, settings)
    assert leases.fail(dialect, lease, error_info(outcome.error, 1), **plan) == "scheduled"
    row = Job.objects.get(pk=job.pk)
    assert row.state == Job.State.SCHEDULED
    assert row.lease_owner is None
    delay = (row.run_after - row.updated_at).total_seconds()
    assert 7.5 <= delay <= 12.5
    assert row.last_error["type"] == "builtins.RuntimeError"
    assert row.last_error["message"] == "nope"
    assert row.last_error["attempt"] == 1


def jobqueue_conf(**overrides):
    return dataclasses.replace(conf.get(), **overrides)


@only_sqlite("SQLite's database write lock")
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
    assert seconds(float("1e300")).days == 3650


# -- the worker row is the liveness: who may take a lease back --------------------------------


def register(worker_id: str, *, alive: bool, job_ids: list[int], ttl: float = TTL) -> None:
    now = timezone.now()
    Worker.objects.create(
        id=worker_id,
        host="h",
        pid=1,
        concurrency=1,
        started_at=now,
        heartbeat_at=now,
        lease_ttl=ttl,
        expires_at=now + dt.timedelta(seconds=ttl if alive else -ttl),
        job_ids=job_ids,
    )


def expire_lease(job_id: int) -> None:
    Job.objects.filter(pk=job_id).update(lease_expires=timezone.now() - dt.timedelta(hours=1))


def test_expired_lease_of_a_live_worker_that_holds_the_job_is_kept_and_pushed_back(dialect):
    """A lease row that missed its renewals (an application held it locked) is not taken from
    a worker whose own row is fresh and lists the job: its deadline moves to the worker's."""
    job = jobqueue.enqueue("test.noop")
    claim_one(dialect, "w1")
    register("w1", alive=True, job_ids=[job.pk])
    expire_lease(job.pk)
    assert reclaim_expired(dialect, batch=10) == []
    row = Job.objects.get(pk=job.pk)
    assert row.state == Job.State.RUNNING
    assert row.lease_expires == Worker.objects.get(pk="w1").expires_at


def test_expired_lease_of_a_live_worker_that_lost_track_of_the_job_is_reclaimed(dialect):
    job = jobqueue.enqueue("test.noop")
    claim_one(dialect, "w1")
    register("w1", alive=True, job_ids=[])
    expire_lease(job.pk)
    assert reclaim_expired(dialect, batch=10) == [(job.pk, Job.State.SCHEDULED)]


def test_expired_lease_of_a_gone_worker_waits_until_the_reclaimer_may_judge(dialect):
    """A reclaimer that has not been healthy for the owner's TTL itself (after an outage, say)
    leaves the job alone; once it may judge, the job comes back."""
    job = jobqueue.enqueue("test.noop")
    claim_one(dialect, "w1")
    register("w1", alive=False, job_ids=[job.pk], ttl=7.0)
    expire_lease(job.pk)
    asked: list[float | None] = []

    def not_yet(ttl: float | None) -> bool:
        asked.append(ttl)
        return False

    assert reclaim_expired(dialect, batch=10, may_judge=not_yet) == []
    assert asked == [7.0]
    assert Job.objects.get(pk=job.pk).state == Job.State.RUNNING
    moved = reclaim_expired(dialect, batch=10)
    assert moved == [(job.pk, Job.State.SCHEDULED)]


# -- the batched finish ----------------------------------------------------------------------


def test_finish_many_records_a_batch_and_reports_lost_leases(dialect):
    jobs = [jobqueue.enqueue("test.noop") for _ in range(4)]
    claimed = leases.claim(dialect, owner="w1", queues=[], limit=4, lease_ttl=TTL)
    assert len(claimed) == 4
    Job.objects.filter(pk=jobs[1].pk).update(cancel_requested=True)
    expire_and_reclaim(dialect, jobs[3].pk)  # this attempt is lost
    items = [
        (j.pk, j.attempts, json.dumps({"n": n}) if n % 2 else None) for n, j in enumerate(claimed)
    ]
    report = leases.finish_many(dialect, "w1", items)
    assert sorted(f.job_id for f in report.finished) == [j.pk for j in jobs[:3]]
    assert report.lost == [jobs[3].pk] and report.busy == []
    rows = Job.objects.in_bulk([j.pk for j in jobs])
    assert (rows[jobs[0].pk].state, rows[jobs[0].pk].result) == ("done", None)
    assert (rows[jobs[1].pk].state, rows[jobs[1].pk].result) == ("cancelled", None)
    assert (rows[jobs[2].pk].state, rows[jobs[2].pk].result) == ("done", None)
    assert all(rows[j.pk].lease_owner is None for j in jobs[:3])
    assert rows[jobs[3].pk].state == Job.State.READY


def test_a_claim_tells_which_jobs_are_in_a_graph_and_their_finish_skips_the_short_path(dialect):
    """A claimed job knows whether it had dependents, a container or children (`in_graph`);
    the completer sends those straight to the finish's transaction, not first through the
    one-statement finish (PostgreSQL) that would leave them anyway. A job that got dependents
    after its claim still moves its graph: the short path's own test of the row holds it back."""
    from django.test.utils import CaptureQueriesContext

    with jobqueue.graph() as g:
        upstream = g.add("test.noop")
        downstream = g.add("test.noop", depends_on=[upstream])
    with jobqueue.container("box") as box:
        child = jobqueue.enqueue("test.noop", parent=box)
    lone = jobqueue.enqueue("test.noop")
    batch = leases.claim(dialect, owner="w", queues=[], limit=10, lease_ttl=TTL)
    claimed = {c.pk: c for c in batch}
    assert claimed.keys() == {upstream.pk, child.pk, lone.pk}
    assert claimed[upstream.pk].in_graph and claimed[child.pk].in_graph
    assert not claimed[lone.pk].in_graph
    assert not claimed[upstream.pk].model().has_steps  # the model still builds from the claim
    late = jobqueue.enqueue("test.noop", depends_on=[lone.pk])  # a dependent since the claim
    items = [(pk, c.attempts, None) for pk, c in sorted(claimed.items())]
    in_graph = {pk for pk, c in claimed.items() if c.in_graph}
    with CaptureQueriesContext(connection) as queries:
        report = leases.finish_many(dialect, "w", items, in_graph=in_graph)
    assert sorted(f.job_id for f in report.finished) == sorted(claimed)
    short = [q["sql"] for q in queries.captured_queries if "NOT j.has_dependents" in q["sql"]]
    if dialect.autocommit_statements:
        [statement] = short  # for the lone job alone (the batch travels as a JSON document)
        assert f'"id":{lone.pk},' in statement
        assert not any(f'"id":{pk},' in statement for pk in in_graph)
    else:
        assert short == []
    states = dict(Job.objects.values_list("pk", "state"))
    assert states[downstream.pk] == states[late.pk] == Job.State.READY


@needs_skip_locked("row locks: SQLite locks the whole database")
def test_finish_and_fail_skip_a_row_another_transaction_holds_locked(dialect):
    """A finished job whose row an application transaction holds is left for later (busy),
    and the rest of the batch is written at once."""
    held, free = (jobqueue.enqueue("test.noop") for _ in range(2))
    claimed = {
        j.pk: j for j in leases.claim(dialect, owner="w1", queues=[], limit=2, lease_ttl=TTL)
    }
    items = [(pk, j.attempts, None) for pk, j in claimed.items()]
    locked = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with transaction.atomic():
            list(Job.objects.select_for_update().filter(pk=held.pk))
            locked.set()
            release.wait(30)

    thread = threading.Thread(target=lambda: (hold(), connections.close_all()))
    thread.start()
    try:
        assert locked.wait(30)
        report = in_new_thread(lambda: leases.finish_many(get_dialect("default"), "w1", items))
        assert report.busy == [held.pk]
        assert [f.job_id for f in report.finished] == [free.pk]
        lease = leases.Lease(held.pk, "w1", claimed[held.pk].attempts)
        state = in_new_thread(
            lambda: leases.fail(get_dialect("default"), lease, {"type": "x"}, dead=True)
        )
        assert state == leases.BUSY
    finally:
        release.set()
        thread.join(30)
    assert Job.objects.get(pk=held.pk).state == Job.State.RUNNING
    assert leases.finish(dialect, lease, 1) == "done"


# -- scheduled jobs ----------------------------------------------------------------------------


def test_due_scheduled_jobs_are_promoted_and_future_ones_wait(dialect):
    from django_jobqueue.engine.staging import promote_due
    from django_jobqueue.worker.promoter import seconds_until_due

    soon = jobqueue.enqueue("test.noop", run_after=dt.timedelta(seconds=30))
    later = jobqueue.enqueue("test.noop", run_after=dt.timedelta(hours=1))
    assert {soon.state, later.state} == {Job.State.SCHEDULED}
    assert leases.claim(dialect, owner="w1", queues=[], limit=5, lease_ttl=TTL) == []
    assert 25 < seconds_until_due(dialect) <= 30
    assert promote_due(dialect, batch=10) == 0
    Job.objects.filter(pk=soon.pk).update(run_after=timezone.now() - dt.timedelta(seconds=1))
    assert promote_due(dialect, batch=10) == 1
    assert Job.objects.get(pk=soon.pk).state == Job.State.READY
    assert Job.objects.get(pk=later.pk).state == Job.State.SCHEDULED
    assert [j.pk for j in leases.claim(dialect, owner="w1", queues=[], limit=5, lease_ttl=TTL)] == [
        soon.pk
    ]


def test_stale_worker_rows_are_judged_by_their_own_lease_ttl(dialect):
    """A row is swept once its heartbeat is older than four of *its* TTLs: a worker with a
    long TTL is not swept by one with a short TTL while it is alive by its own."""
    from django_jobqueue.worker.reclaimer import sweep_workers

    beat = timezone.now() - dt.timedelta(seconds=60)
    for worker_id, ttl in (("short", 10.0), ("long", 30.0)):
        Worker.objects.create(
            id=worker_id, host="h", pid=1, concurrency=1, started_at=beat,
            heartbeat_at=beat, lease_ttl=ttl, expires_at=beat + dt.timedelta(seconds=ttl),
        )  # fmt: skip
    assert sweep_workers(dialect, stale_after=4.0) == 1
    assert list(Worker.objects.live().values_list("pk", flat=True)) == ["long"]
    assert list(Worker.objects.gone().values_list("pk", flat=True)) == ["short"]


def test_gone_worker_rows_are_kept_an_hour_then_deleted(dialect):
    """A gone row stays for the Workers page for GONE_KEPT seconds; the sweep then deletes it,
    and no reader of liveness counts it meanwhile."""
    from django_jobqueue.engine.control import owner_alive
    from django_jobqueue.worker.reclaimer import GONE_KEPT, sweep_workers

    now = timezone.now()
    for worker_id, gone in (("recent", 60.0), ("old", GONE_KEPT + 60.0)):
        moment = now - dt.timedelta(seconds=gone)
        Worker.objects.create(
            id=worker_id, host="h", pid=1, concurrency=1, started_at=moment,
            heartbeat_at=moment, expires_at=moment, gone_at=moment, jobs_reclaimed=2,
        )  # fmt: skip
    assert sweep_workers(dialect, stale_after=4.0) == 0
    assert list(Worker.objects.values_list("pk", flat=True)) == ["recent"]
    assert not owner_alive("recent")
    assert not Worker.objects.live().exists()
