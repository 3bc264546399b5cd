"""The dialect contract: what every database's claim, finish, promote and reclaim must do.

One suite, run unchanged on SQLite, PostgreSQL and MariaDB/MySQL (Oban's and River's habit per
engine): each test names a behaviour of the lease protocol, and drives the dialect's own
methods (`claim_ready`, `mark_claimed`, `finish_many`, `finish_simple`, `promote`, `now`) and
the transitions built on them (`leases`, the promoter, the reclaimer). A dialect that overrides
one of them with its own SQL must pass the same tests as the portable version in `base.py`.
A test is skipped only where a capability is absent, named by the dialect's flag; tests of one
vendor's quirks live beside this file (test_leases.py, test_explain.py, test_isolation_levels.py).
"""

from __future__ import annotations

import datetime as dt
import json
import threading
from typing import Any

import pytest
from django.db import Error as DatabaseErrors

from django_jobqueue import pausing
from django_jobqueue.dialects import get_dialect
from django_jobqueue.dialects.base import Dialect
from django_jobqueue.dialects.sql import StatementCache
from django_jobqueue.engine import leases
from django_jobqueue.engine.staging import promote_due
from django_jobqueue.models import Job, Worker
from django_jobqueue.models.functions import DbNow
from django_jobqueue.worker.reclaimer import reclaim_expired
from tests.conftest import in_new_thread
from tests.support.factories import JobDependencyFactory, JobFactory
from tests.support.markers import needs_skip_locked

# Claims and finishes commit (and one test uses a second connection): no wrapping transaction.
pytestmark = pytest.mark.django_db(transaction=True)

TTL = 30.0
DIALECT = get_dialect("default")


@pytest.fixture
def dialect() -> Dialect:
    return get_dialect("default")


def ready_jobs() -> Any:
    return Job.objects.using("default").ready()


def claim(dialect: Dialect, owner: str = "w1", limit: int = 10, **kwargs: Any) -> list[Any]:
    return leases.claim(dialect, owner=owner, queues=[], limit=limit, lease_ttl=TTL, **kwargs)


def claim_in_transaction(dialect: Dialect, owner: str = "w1", limit: int = 10) -> list[Any]:
    """The dialect's claim statement itself, inside the claim transaction."""
    return dialect.run_in_transaction(
        lambda: dialect.claim_ready(ready_jobs(), owner=owner, limit=limit, lease_ttl=TTL)
    )


CLAIMS = {"leases.claim": claim, "dialect.claim_ready": claim_in_transaction}


@pytest.fixture(params=sorted(CLAIMS))
def claim_by(request: pytest.FixtureRequest) -> Any:
    """Each way in: the worker's claim() (one autocommit statement where the dialect can), and
    the dialect's claim_ready() inside a transaction."""
    return CLAIMS[request.param]


def finish_in_transaction(
    dialect: Dialect, owner: str, items: list[tuple[int, int, str | None]]
) -> leases.FinishReport:
    return dialect.run_in_transaction(lambda: dialect.finish_many(owner=owner, items=items))


FINISHES = {"leases.finish_many": leases.finish_many, "dialect.finish_many": finish_in_transaction}


@pytest.fixture(params=sorted(FINISHES))
def finish_by(request: pytest.FixtureRequest) -> Any:
    """Each way in: the worker's finish_many() (finish_simple() first where the dialect has
    autocommit statements), and the dialect's finish_many() inside a transaction."""
    return FINISHES[request.param]


def row(job_id: int) -> dict[str, Any]:
    return Job.objects.filter(pk=job_id).values().get()


def expire(job_id: int, dialect: Dialect) -> None:
    Job.objects.filter(pk=job_id).update(lease_expires=dialect.now() - dt.timedelta(hours=1))


def register(dialect: Dialect, worker_id: str, *, alive: bool, job_ids: list[int]) -> None:
    now = dialect.now()
    Worker.objects.create(
        id=worker_id, host="h", pid=1, concurrency=1, started_at=now, heartbeat_at=now,
        lease_ttl=TTL, expires_at=now + dt.timedelta(seconds=TTL if alive else -TTL),
        job_ids=job_ids,
    )  # fmt: skip


# -- the clock -----------------------------------------------------------------------------


def test_now_is_the_database_clock(dialect):
    """now() reads the clock the database writes with (DbNow), as an aware UTC datetime."""
    job = JobFactory()
    before = dialect.now()
    Job.objects.filter(pk=job.pk).update(updated_at=DbNow())
    after = dialect.now()
    written = Job.objects.get(pk=job.pk).updated_at
    assert before.tzinfo == dt.UTC and after.tzinfo == dt.UTC
    assert before <= written <= after


# -- the claim -----------------------------------------------------------------------------


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

    holder = threading.Thread(target=lambda: (hold(), _close_connections()))
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


def _close_connections() -> None:
    from django.db import connections

    connections.close_all()


# -- the finish ----------------------------------------------------------------------------


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


# -- promotion -----------------------------------------------------------------------------


def test_promote_makes_only_due_scheduled_jobs_ready(dialect):
    """Due scheduled jobs become ready, earliest first and at most `batch`; the rest wait."""
    now = dialect.now()
    due = [
        JobFactory(state=Job.State.SCHEDULED, run_after=now - dt.timedelta(seconds=s))
        for s in (1, 3, 2)
    ]
    future = JobFactory(state=Job.State.SCHEDULED, run_after=now + dt.timedelta(hours=1))
    waiting = JobFactory(state=Job.State.WAITING, run_after=now - dt.timedelta(hours=1))
    assert promote_due(dialect, batch=2) == 2
    states = dict(Job.objects.values_list("pk", "state"))
    assert states[due[1].pk] == states[due[2].pk] == Job.State.READY  # the two earliest
    assert states[due[0].pk] == Job.State.SCHEDULED
    assert promote_due(dialect, batch=2) == 1
    assert promote_due(dialect, batch=2) == 0
    states = dict(Job.objects.values_list("pk", "state"))
    assert states[due[0].pk] == Job.State.READY
    assert states[future.pk] == Job.State.SCHEDULED
    assert states[waiting.pk] == Job.State.WAITING


def test_a_promotion_wakes_the_workers_of_its_queues_here_and_elsewhere(dialect, monkeypatch):
    """A promotion tells this process's idle workers (wake.notify) of each queue it made ready
    and, where the database can push (PostgreSQL's NOTIFY, sent by the promoting statement
    itself), the workers of every other process; a promotion of nothing tells no one."""
    from django.db import connections

    from django_jobqueue.engine import wake

    woken: list[str] = []
    monkeypatch.setattr(wake, "notify", lambda using, queue: woken.append(queue))
    now = dialect.now()
    for queue in ("mail", "mail", "reports"):
        JobFactory(state=Job.State.SCHEDULED, queue=queue, run_after=now - dt.timedelta(seconds=1))
    listener = connections.create_connection("default")  # another session: another process
    try:
        listener.set_autocommit(True)
        pushes = dialect.supports_listen_notify
        if pushes:
            with listener.cursor() as cursor:
                cursor.execute("LISTEN django_jobqueue")
        assert promote_due(dialect, batch=10) == 3
        assert sorted(woken) == ["mail", "reports"]
        if pushes:
            received = list(listener.connection.notifies(timeout=10, stop_after=2))
            assert sorted(n.payload for n in received) == ["mail", "reports"]
        woken.clear()
        assert promote_due(dialect, batch=10) == 0
        assert woken == []
    finally:
        listener.close()


def test_promote_frees_only_waiting_jobs_whose_upstreams_are_all_done(dialect):
    """Dialect.promote(): a waiting job whose upstreams are done becomes ready, or scheduled
    when its run_after lies ahead; one with an unfinished upstream keeps waiting."""
    now = dialect.now()
    done = JobFactory(state=Job.State.DONE, finished_at=now)
    running = JobFactory(state=Job.State.RUNNING, lease_owner="w0", lease_expires=now)

    def waiting(queue: str, *upstreams: Job, **fields: Any) -> Job:
        job = JobFactory(state=Job.State.WAITING, queue=queue, **fields)
        for upstream in upstreams:
            JobDependencyFactory(job=job, depends_on=upstream)
        return job

    free = waiting("free", done)
    later = waiting("later", done, run_after=now + dt.timedelta(hours=1))
    blocked = waiting("blocked", done, running)
    elsewhere = JobFactory(state=Job.State.READY, queue="elsewhere")
    ids = [free.pk, later.pk, blocked.pk, elsewhere.pk]
    queues = dialect.run_in_transaction(lambda: dialect.promote(ids))
    assert queues == {"free", "later"}
    states = dict(Job.objects.values_list("pk", "state"))
    assert states[free.pk] == Job.State.READY
    assert states[later.pk] == Job.State.SCHEDULED
    assert states[blocked.pk] == Job.State.WAITING
    assert states[elsewhere.pk] == Job.State.READY
    assert dialect.run_in_transaction(lambda: dialect.promote([blocked.pk])) == set()


# -- reclaim, release, renewal --------------------------------------------------------------


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


def test_an_array_literal_reads_back_as_its_values_and_refuses_other_types(dialect):
    from django_jobqueue.models.literals import array

    values = ['a"b', "c\\d", "x,y", "{z}", " s ", "NULL", "", "it's", "ü€"]
    if dialect.vendor == "postgresql":
        with dialect.connection.cursor() as cursor:
            cursor.execute("SELECT %s::text[], %s::bigint[]", [array(values), array([1, 2**62])])
            assert cursor.fetchone() == (values, [1, 2**62])
    # None would read back as the text "None"; a float or a bool is never an id or a key.
    for bad in (None, True, 5.0):
        with pytest.raises(TypeError):
            array(["a", bad])


def test_a_read_of_several_groups_locks_each_groups_best_jobs_and_skips_locked_ones(dialect):
    """`group_reads_sql`: one statement reads, for each (group, count), that group's best
    ready jobs (priority, then age) up to its count, each row numbered by its read, locked
    with SKIP LOCKED (a row another transaction holds is passed over, not waited for); one
    read's rows come without the number. (SQLite has no row locks: its writers take turns on
    the whole database, and nothing is held while it reads.)"""
    locks = dialect.has_select_for_update_skip_locked
    jobs = {
        group: [JobFactory(group_key=group, priority=p).pk for p in priorities]
        for group, priorities in {"a": (0, 5, 5, 1), "b": (0, 0), "c": (2,)}.items()
    }
    best_of_a = jobs["a"][1]  # the older of its two jobs of priority 5
    query = ready_jobs().order_by("-priority", "pk").values_list("pk", "group_key", "priority")
    held, let_go = threading.Event(), threading.Event()

    def hold() -> None:
        def txn() -> None:
            list(Job.objects.select_for_update().filter(pk=best_of_a).values_list("pk"))
            held.set()
            let_go.wait(60)

        get_dialect("default").run_in_transaction(txn)

    def read(reads: list[tuple[str, int]]) -> list[tuple[Any, ...]]:
        def txn() -> list[tuple[Any, ...]]:
            found = []
            for sql, params in dialect.group_reads_sql(query, reads, [], {}):
                with dialect.cursor() as cursor:
                    cursor.execute(sql, params)
                    found += [tuple(row) for row in cursor.fetchall()]
            return found

        return in_new_thread(lambda: dialect.run_in_transaction(txn))

    holder = threading.Thread(target=lambda: (hold(), _close_connections()))
    if locks:
        holder.start()
    try:
        assert not locks or held.wait(60)
        rows = read([("a", 2), ("b", 5), ("c", 1)])
        alone = read([("b", 1)])
    finally:
        let_go.set()
        if locks:
            holder.join(60)
    by_read: dict[int, list[int]] = {}
    # Within a read the rows come in any order, and a dialect may return up to the largest
    # count of the reads: the caller keeps each read's first `count` in claim order.
    for n, pk, group, _ in sorted(rows, key=lambda row: (row[0], -row[3], row[1])):
        assert group == "abc"[n]
        if len(by_read.setdefault(n, [])) < (2, 5, 1)[n]:
            by_read[n].append(pk)
    assert {n: sorted(pks) for n, pks in by_read.items()} == {
        # the best but the locked one (where rows are locked)
        0: sorted(jobs["a"][2:] if locks else [best_of_a, jobs["a"][2]]),
        1: sorted(jobs["b"]),
        2: jobs["c"],
    }
    assert alone == [(jobs["b"][0], "b", 0)]


def test_reads_of_many_groups_are_split_within_the_databases_limit_of_parameters(
    dialect, monkeypatch
):
    """The portable `group_reads_sql` (a UNION ALL, each read repeating the ready filter's
    parameters) splits its reads into statements that each stay within the database's
    limit of parameters (SQLite's may be 999): every read still gets its rows."""
    from django.db import connection

    groups = [f"g{n}" for n in range(12)]
    expected = {group: JobFactory(group_key=group).pk for group in groups}
    query = ready_jobs().order_by("-priority", "pk").values_list("pk", "group_key")
    reads = [(group, 1) for group in groups]

    # The portable UNION ALL, not a dialect's own merged form (PostgreSQL's, SQLite's).
    monkeypatch.setattr(dialect, "merged_group_reads_sql", lambda *args: None)

    def statements() -> list[tuple[str, list[Any]]]:
        return dialect.run_in_transaction(lambda: dialect.group_reads_sql(query, reads, [], {}))

    per_read = len(statements()[0][1]) // len(groups)  # each read's parameters
    # A property on the class: it wins over a value cached on the instance (PostgreSQL's).
    limit = property(lambda features: per_read * 5)
    monkeypatch.setattr(type(connection.features), "max_query_params", limit)
    split = statements()
    assert [len(params) // per_read for _, params in split] == [5, 5, 2]

    def run() -> dict[str, int]:
        found = {}
        for sql, params in split:
            with dialect.cursor() as cursor:
                cursor.execute(sql, params)
                for n, pk, group in cursor.fetchall():
                    assert groups[n] == group
                    found[group] = pk
        return found

    assert dialect.run_in_transaction(run) == expected


def test_no_reads_of_groups_is_no_statement(dialect):
    """`group_reads_sql` of no reads (a claim that planned nothing) gives no statement."""
    query = ready_jobs().order_by("-priority", "pk").values_list("pk", "group_key")
    assert dialect.run_in_transaction(lambda: dialect.group_reads_sql(query, [], [], {})) == []


def test_the_compiled_statements_a_dialect_keeps_are_bounded():
    """A key that takes ever new values (what is paused) never grows the cache past its
    limit: it starts over, and the statement just stored is there."""
    cache = StatementCache(limit=3)
    for shape in range(10):
        cache[("claim", shape)] = (f"SELECT {shape}", [])
        assert cache[("claim", shape)] == (f"SELECT {shape}", [])
        assert len(cache) <= 3
    cache[("claim", 9)] = ("SELECT 9", [])  # a shape it holds: nothing is dropped
    assert len(cache) == 1  # emptied at shapes 3, 6 and 9
    assert isinstance(get_dialect("default")._sql_cache, StatementCache)
