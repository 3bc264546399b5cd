"""The dialect contract: the claim (every database's claim must pass it)."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest
from django.db import Error as DatabaseErrors

from django_jobqueue import pausing
from django_jobqueue.dialects import get_dialect
from django_jobqueue.engine import leases
from django_jobqueue.models import Job
from django_jobqueue.models.functions import DbNow
from tests.conftest import in_new_thread
from tests.support.dialect_contract import TTL, claim, close_connections, ready_jobs, row
from tests.support.factories import JobFactory
from tests.support.markers import needs_skip_locked

# Claims and finishes commit (and one test uses a second connection): no wrapping transaction.
pytestmark = pytest.mark.django_db(transaction=True)


def test_now_is_the_database_clock(dialect):
    """now() reads the clock the database writes with (DbNow), as an aware UTC datetime."""
    job = JobFactory()
    before = dialect.now()
    Job.objects.filter(pk=job.pk).update(updated_at=DbNow())
    after = dialect.now()
    written = Job.objects.get(pk=job.pk).updated_at
    assert before.tzinfo == dt.UTC and after.tzinfo == dt.UTC
    assert before <= written <= after


def test_claim_returns_ready_jobs_by_priority_then_age(dialect, claim_by):
    a, b, c, d, e = (JobFactory(priority=p) for p in (0, 5, 0, 5, -1))
    claimed = claim_by(dialect, limit=10)
    assert [j.id for j in claimed] == [b.pk, d.pk, a.pk, c.pk, e.pk]


def test_claim_takes_the_best_jobs_up_to_the_limit(dialect, claim_by):
    a, b, c = (JobFactory(priority=p) for p in (1, 3, 2))
    assert [j.id for j in claim_by(dialect, limit=1)] == [b.pk]
    assert [j.id for j in claim_by(dialect, limit=1)] == [c.pk]
    assert [j.id for j in claim_by(dialect, limit=5)] == [a.pk]  # fewer than the limit left
    assert claim_by(dialect, limit=5) == []


def test_claim_with_no_room_claims_nothing(dialect):
    """limit=0 (or less) claims nothing on every database, whatever path the claim takes."""
    JobFactory()
    assert claim(dialect, limit=0) == []
    assert claim(dialect, limit=-1) == []
    assert Job.objects.filter(state=Job.State.READY).count() == 1


def test_claim_takes_exactly_the_limit_when_more_are_ready(dialect, claim_by):
    ids = [JobFactory().pk for _ in range(7)]
    claimed = claim_by(dialect, limit=3)
    assert [j.id for j in claimed] == ids[:3]
    assert Job.objects.filter(state=Job.State.RUNNING).count() == 3
    assert Job.objects.filter(state=Job.State.READY).count() == 4


def test_claim_marks_running_with_a_new_generation(dialect, claim_by):
    """The claim bumps `attempts` (the lease's generation), records the owner, and sets every
    deadline from the database clock; the record returned shows the claim's own writes."""
    first = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    job = JobFactory(attempts=2, max_attempts=5, first_started_at=first, worker_ids=["w0"])
    before = dialect.now()
    [claimed] = claim_by(dialect, owner="w1")
    after = dialect.now()
    assert (claimed.id, claimed.state, claimed.attempts, claimed.lease_owner) == (
        job.pk,
        Job.State.RUNNING,
        3,
        "w1",
    )
    stored = row(job.pk)
    assert stored["state"] == Job.State.RUNNING
    assert stored["attempts"] == 3
    assert stored["lease_owner"] == "w1"
    assert stored["worker_ids"] == ["w0", "w1"]
    assert stored["first_started_at"] == first  # the first attempt's start is kept
    for column in ("started_at", "heartbeat_at", "updated_at"):
        assert before <= stored[column] <= after, column
    ttl = dt.timedelta(seconds=TTL)
    assert before + ttl <= stored["lease_expires"] <= after + ttl


def test_claim_leaves_out_jobs_that_are_not_ready(dialect, claim_by):
    ready = JobFactory()
    JobFactory(state=Job.State.READY, run_after=dialect.now() + dt.timedelta(hours=1))
    now = dialect.now()
    JobFactory(state=Job.State.SCHEDULED, run_after=now - dt.timedelta(hours=1))  # not promoted
    JobFactory(state=Job.State.WAITING)
    JobFactory(state=Job.State.RUNNING, lease_owner="w0", lease_expires=now)
    for state in Job.TERMINAL_STATES:
        JobFactory(state=state, finished_at=now)
    assert [j.id for j in claim_by(dialect)] == [ready.pk]


def test_claim_takes_a_ready_job_whose_run_after_has_passed(dialect, claim_by):
    job = JobFactory(run_after=dialect.now() - dt.timedelta(seconds=1))
    assert [j.id for j in claim_by(dialect)] == [job.pk]


def test_claim_leaves_out_paused_queues(dialect):
    JobFactory(queue="paused", priority=9)
    served = JobFactory(queue="served")
    assert pausing.pause_queue("paused")
    assert [j.id for j in claim(dialect)] == [served.pk]
    assert pausing.resume_queue("paused")
    assert [j.queue for j in claim(dialect)] == ["paused"]


def test_claim_leaves_out_jobs_of_paused_resources_and_workflows(dialect):
    tenant = JobFactory(uses={"tenant:1": 1, "api": 1}, priority=9)
    group = JobFactory(group_key="acme", priority=9)
    box = JobFactory(is_container=True, state=Job.State.WAITING)
    child = JobFactory(parent=box, priority=9)
    served = [JobFactory(uses={"api": 1}), JobFactory()]
    assert pausing.pause_resource("tenant:*") and pausing.pause_resource("group:acme")
    assert pausing.pause_workflow(box.pk)
    assert sorted(j.id for j in claim(dialect)) == sorted(j.pk for j in served)
    assert pausing.resume_resource("tenant:*") and pausing.resume_resource("group:acme")
    assert pausing.resume_workflow(box.pk)
    assert sorted(j.id for j in claim(dialect)) == sorted([tenant.pk, group.pk, child.pk])


def test_claim_leaves_out_types_without_a_handler(dialect):
    """A job of a type this process has no handler for waits for a worker that has one."""
    unknown = JobFactory(type="contract.no_such_handler", priority=9)
    known = JobFactory()
    assert [j.id for j in claim(dialect)] == [known.pk]
    assert row(unknown.pk)["state"] == Job.State.READY


def test_claim_takes_only_the_queues_asked_for(dialect):
    JobFactory(queue="other", priority=9)
    mine = JobFactory(queue="mine")
    claimed = leases.claim(dialect, owner="w1", queues=["mine"], limit=10, lease_ttl=TTL)
    assert [j.id for j in claimed] == [mine.pk]


@pytest.mark.parametrize("others", [0, 8], ids=["a-few-queues", "past-the-merge"])
def test_a_claim_of_several_queues_takes_their_best_jobs_in_claim_order(dialect, others):
    """A claim of two to eight queues merges one read per queue (compile_merged); of more,
    it reads the ready index: either way the best jobs of those queues, by priority then
    age, and none of another queue's or of a paused one's."""
    jobs = [
        JobFactory(queue=queue, priority=priority)
        for priority in (0, 5, 1)
        for queue in ("a", "b", "c", "paused")
    ]
    assert pausing.pause_queue("paused")
    queues = ["a", "b", "paused", *(f"empty{n}" for n in range(others))]
    best = sorted((j for j in jobs if j.queue in ("a", "b")), key=lambda j: (-j.priority, j.pk))[:4]
    claimed = leases.claim(dialect, owner="w1", queues=queues, limit=4, lease_ttl=TTL)
    assert [j.id for j in claimed] == [j.pk for j in best]
    assert all(row(j.id)["state"] == Job.State.RUNNING for j in claimed)


def test_a_queue_named_twice_is_read_once(dialect):
    """Each queue's read of a merged claim locks its rows: a queue read twice would hand the
    same jobs twice (a transaction's own locks are not skipped)."""
    jobs = [JobFactory(queue=queue) for queue in ("a", "b") for _ in range(3)]
    claimed = leases.claim(dialect, owner="w1", queues=["a", "a", "b"], limit=10, lease_ttl=TTL)
    assert sorted(j.id for j in claimed) == sorted(j.pk for j in jobs)


def test_a_worker_without_handlers_claims_nothing(dialect, monkeypatch):
    """No handler type to claim: no job, and no statement that an empty list of types would
    break (an empty IN list compiles to no SQL at all)."""
    from django_jobqueue import registry

    JobFactory(queue="a")
    JobFactory(queue="b")
    monkeypatch.setattr(registry, "allowlist", lambda: ())
    monkeypatch.setattr(registry, "served", lambda: ())  # the keys with their versions
    for queues in ([], ["a"], ["a", "b"]):
        assert leases.claim(dialect, owner="w1", queues=queues, limit=10, lease_ttl=TTL) == []


def test_the_statements_of_a_worker_transaction_share_one_cursor(dialect):
    """Dialect.cursor(): one cursor for the statements of a run_in_transaction() (each new
    one cost about 25 µs of Python on the claim's path), closed when it ends, even by an
    error; outside, a cursor each, closed after."""
    seen: list[Any] = []

    def txn() -> None:
        for _ in range(2):
            with dialect.cursor() as cursor:
                cursor.execute("SELECT 1")
                assert list(cursor.fetchall()) == [(1,)]
                seen.append(cursor)

    dialect.run_in_transaction(txn)
    assert seen[0] is seen[1] and closed(seen[0])

    def fails() -> None:
        with dialect.cursor() as cursor:
            seen.append(cursor)
        raise ValueError("the handler's bug")

    with pytest.raises(ValueError):
        dialect.run_in_transaction(fails)
    assert seen[2] is not seen[0] and closed(seen[2])
    with dialect.cursor() as one, dialect.cursor() as two:
        assert one is not two
    assert closed(one) and closed(two)


def closed(cursor: Any) -> bool:
    """Whether a Django cursor was closed (none of the three drivers runs a statement then)."""
    try:
        cursor.execute("SELECT 1")
    except DatabaseErrors:
        return True
    return False


def test_mark_claimed_marks_the_chosen_rows_in_the_order_given(dialect):
    """The planned claim (fair share, limits) chooses and locks the ids itself; mark_claimed
    turns them into leases, in the planner's order."""
    a, b, c = (JobFactory() for _ in range(3))
    order = [c.pk, a.pk]

    def txn() -> list[Any]:
        list(dialect.lock(Job.objects.filter(pk__in=order)).values_list("pk", flat=True))
        return dialect.mark_claimed(order, owner="planner", lease_ttl=TTL)

    claimed = dialect.run_in_transaction(txn)
    assert [(j.id, j.state, j.attempts, j.lease_owner) for j in claimed] == [
        (c.pk, Job.State.RUNNING, 1, "planner"),
        (a.pk, Job.State.RUNNING, 1, "planner"),
    ]
    assert row(b.pk)["state"] == Job.State.READY
    assert (
        dialect.run_in_transaction(lambda: dialect.mark_claimed([], owner="planner", lease_ttl=TTL))
        == []
    )


@needs_skip_locked(
    "has_select_for_update_skip_locked is False: one writer holds the whole database"
)
def test_two_connections_never_claim_the_same_row():
    """While one claim transaction holds its rows, a claim on another connection skips them
    at once (SKIP LOCKED) and takes the rest: no row is claimed twice, no claim waits."""
    ids = [JobFactory().pk for _ in range(6)]
    held, let_go = threading.Event(), threading.Event()
    first: dict[str, Any] = {}

    def hold() -> None:
        dialect = get_dialect("default")

        def txn() -> None:
            first["jobs"] = dialect.claim_ready(ready_jobs(), owner="w1", limit=3, lease_ttl=TTL)
            held.set()
            # True only if the test let go: a second claim that waited would time this out.
            first["let_go"] = let_go.wait(60)

        try:
            dialect.run_in_transaction(txn)
        except BaseException as exc:  # surfaced below
            first["error"] = exc
            held.set()

    holder = threading.Thread(target=lambda: (hold(), close_connections()))
    holder.start()
    try:
        assert held.wait(60)
        assert "error" not in first
        second = in_new_thread(lambda: claim(get_dialect("default"), owner="w2", limit=10))
    finally:
        let_go.set()
        holder.join(60)
    assert first.get("let_go") is True
    mine, theirs = [j.id for j in first["jobs"]], [j.id for j in second]
    assert mine == ids[:3]
    assert theirs == ids[3:]
    owners = dict(Job.objects.values_list("pk", "lease_owner"))
    assert [owners[pk] for pk in ids] == ["w1"] * 3 + ["w2"] * 3
