"""enqueue() writes in the caller's transaction: it commits and rolls back with the caller's rows.

Visibility is checked from a second connection (another thread has its own Django connection),
so "committed" means committed for every other session, not just visible to the writer. On
SQLite the test database runs in WAL mode: the reader reads the last committed snapshot while
the writer holds the write lock, and must see no job until the writer commits.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections, transaction
from django.test import override_settings
from django.utils import timezone

import django_jobqueue as jobqueue
from django_jobqueue.engine import wake
from django_jobqueue.engine.enqueuing import _open_transaction_elsewhere
from django_jobqueue.models import Job, JobDependency
from tests.support.extra_databases import sqlite_alias
from tests.support.factories import JobFactory
from tests.testapp.models import Order


class Rollback(Exception):
    """Raised inside atomic() to roll the caller's transaction back."""


def in_other_connection[T](func: Callable[[], T]) -> T:
    """Run `func` in a new thread, hence on a new database connection, and return its result."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = func()
        except BaseException as exc:  # re-raised in the test's thread
            outcome["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the reader thread hung (blocked by the writer?)"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def counts_elsewhere() -> tuple[int, int]:
    """(orders, jobs) as another connection sees them."""
    return in_other_connection(lambda: (Order.objects.count(), Job.objects.count()))


@pytest.fixture
def wake_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str]]]:
    calls: list[tuple[str, str]] = []
    notify = wake.notify

    def recording_notify(using: str, queue: str) -> None:
        calls.append((using, queue))
        notify(using, queue)

    monkeypatch.setattr(wake, "notify", recording_notify)
    yield calls


def test_public_api() -> None:
    assert callable(jobqueue.enqueue)
    assert callable(jobqueue.handler)
    assert issubclass(jobqueue.Retry, Exception)
    assert issubclass(jobqueue.Fail, Exception)
    assert issubclass(jobqueue.JobQueueError, Exception)
    for name in jobqueue.__all__:
        assert getattr(jobqueue, name) is not None, name
    assert jobqueue.JobContext is not None
    with pytest.raises(AttributeError):
        jobqueue.no_such_name  # noqa: B018
    from django_jobqueue.engine.enqueuing import enqueue

    assert jobqueue.enqueue is enqueue
    assert jobqueue.__version__


# --- transactional enqueue, seen from another connection -------------------------------------


@pytest.mark.django_db(transaction=True)
def test_rollback_leaves_neither_the_order_nor_the_job() -> None:
    upstream = jobqueue.enqueue("test.noop")
    with pytest.raises(Rollback), transaction.atomic():
        Order.objects.create(number="A-1")
        job = jobqueue.enqueue("test.add", {"a": 1, "b": 2})
        dependent = jobqueue.enqueue("test.noop", depends_on=[upstream])
        assert Job.objects.filter(pk__in=[job.pk, dependent.pk]).count() == 2
        raise Rollback
    assert Order.objects.count() == 0
    assert list(Job.objects.values_list("pk", flat=True)) == [upstream.pk]
    assert JobDependency.objects.count() == 0
    assert counts_elsewhere() == (0, 1)


@pytest.mark.django_db(transaction=True)
def test_commit_makes_the_order_and_the_job_visible() -> None:
    with transaction.atomic():
        order = Order.objects.create(number="A-2")
        job = jobqueue.enqueue("test.add", {"a": 1, "b": 2})
    assert Order.objects.get(pk=order.pk).number == "A-2"
    stored = Job.objects.get(pk=job.pk)
    assert (stored.type, stored.args, stored.state) == ("test.add", {"a": 1, "b": 2}, "ready")
    assert counts_elsewhere() == (1, 1)


@pytest.mark.django_db(transaction=True)
def test_another_connection_sees_the_job_only_after_commit() -> None:
    with transaction.atomic():
        Order.objects.create(number="A-3")
        job = jobqueue.enqueue("test.noop")
        child = jobqueue.enqueue("test.noop", depends_on=[job])
        # The writer's transaction is open: the reader must see none of its rows, and must not
        # block on the writer's locks either (in_other_connection fails if it hangs).
        assert counts_elsewhere() == (0, 0)
        assert not in_other_connection(lambda: Job.objects.filter(pk=job.pk).exists())
        assert in_other_connection(lambda: JobDependency.objects.count()) == 0
    assert counts_elsewhere() == (1, 2)
    assert in_other_connection(lambda: Job.objects.get(pk=job.pk).state) == "ready"
    assert in_other_connection(lambda: Job.objects.get(pk=child.pk).state) == "waiting"


@pytest.mark.django_db(transaction=True)
def test_enqueue_in_autocommit_is_visible_at_once() -> None:
    job = jobqueue.enqueue("test.noop")
    assert in_other_connection(lambda: Job.objects.filter(pk=job.pk).exists())


@pytest.mark.django_db(transaction=True)
def test_dependency_edges_commit_and_roll_back_with_the_caller() -> None:
    upstream = jobqueue.enqueue("test.noop")
    with transaction.atomic():
        job = jobqueue.enqueue("test.noop", depends_on=[upstream])
        assert in_other_connection(lambda: JobDependency.objects.count()) == 0
    assert in_other_connection(
        lambda: list(JobDependency.objects.values_list("job_id", "depends_on_id"))
    ) == [(job.pk, upstream.pk)]
    assert in_other_connection(lambda: Job.objects.get(pk=job.pk).state) == "waiting"


@pytest.mark.django_db(transaction=True)
def test_wake_signal_fires_only_on_commit(wake_calls: list[tuple[str, str]]) -> None:
    with pytest.raises(Rollback), transaction.atomic():
        jobqueue.enqueue("test.noop", queue="emails")
        raise Rollback
    assert wake_calls == []
    with transaction.atomic():
        jobqueue.enqueue("test.noop", queue="emails")
        assert wake_calls == []
    assert wake_calls == [("default", "emails")]


# --- the caller's transaction is on another database -----------------------------------------
#
# The queue lives on JOBQUEUE['DATABASE'] ('default' here). When the caller has a transaction
# open only on another alias, enqueue() must not write at once (the job would survive a
# rollback of the caller's transaction): it writes on that transaction's commit, via
# transaction.on_commit(). The other alias is an SQLite file added for the test, so this runs
# on every DATABASE_URL: opening a transaction on an empty SQLite database needs no tables.


@pytest.fixture
def other_db(tmp_path: Path) -> Iterator[str]:
    with sqlite_alias("other", tmp_path / "other.sqlite3") as alias:
        yield alias


@pytest.mark.django_db(transaction=True)
def test_open_transaction_elsewhere_detection(other_db: str) -> None:
    assert _open_transaction_elsewhere("default") is None
    with transaction.atomic(using=other_db):
        assert _open_transaction_elsewhere("default") == other_db
        with transaction.atomic():  # a transaction on the queue database wins
            assert _open_transaction_elsewhere("default") is None
    with transaction.atomic():
        assert _open_transaction_elsewhere("default") is None
    assert _open_transaction_elsewhere("default") is None


@pytest.mark.django_db(transaction=True)
def test_enqueue_waits_for_the_commit_of_a_transaction_on_another_database(
    other_db: str, wake_calls: list[tuple[str, str]]
) -> None:
    upstream = jobqueue.enqueue("test.noop")
    wake_calls.clear()
    with transaction.atomic(using=other_db):
        job = jobqueue.enqueue("test.add", {"a": 1, "b": 2}, depends_on=[upstream])
        assert job.pk is None
        assert Job.objects.count() == 1
        assert wake_calls == []
    assert job.pk is not None
    assert Job.objects.get(pk=job.pk).state == "waiting"
    assert list(JobDependency.objects.values_list("job_id", "depends_on_id")) == [
        (job.pk, upstream.pk)
    ]
    assert wake_calls == [("default", "default")]
    assert counts_elsewhere() == (0, 2)


@pytest.mark.django_db(transaction=True)
def test_rollback_of_a_transaction_on_another_database_drops_the_job(other_db: str) -> None:
    with pytest.raises(Rollback), transaction.atomic(using=other_db):
        job = jobqueue.enqueue("test.noop", run_after=dt.timedelta(minutes=5))
        raise Rollback
    assert job.pk is None
    assert Job.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_missing_dependency_is_reported_at_once_when_deferring(other_db: str) -> None:
    with transaction.atomic(using=other_db):
        with pytest.raises(jobqueue.InvalidDependencyError):
            jobqueue.enqueue("test.noop", depends_on=[987654321])
        with pytest.raises(jobqueue.InvalidDependencyError):
            jobqueue.enqueue("test.noop", parent=987654321)
        with pytest.raises(jobqueue.UnknownHandlerError):
            jobqueue.enqueue("no.such.handler")
    assert Job.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_deferred_run_after_delay_is_computed_at_commit(other_db: str) -> None:
    with transaction.atomic(using=other_db):
        job = jobqueue.enqueue("test.noop", run_after=dt.timedelta(minutes=10))
    assert job.run_after is not None and timezone.is_aware(job.run_after)
    assert abs(job.run_after - (timezone.now() + dt.timedelta(minutes=10))) < dt.timedelta(
        minutes=1
    )
    assert not Job.objects.ready().filter(pk=job.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_queue_on_another_database(tmp_path: Path) -> None:
    """JOBQUEUE['DATABASE'] names a second database; the caller's transaction is on 'default'."""
    with (
        sqlite_alias("queue", tmp_path / "queue.sqlite3", migrate=True) as queue_db,
        override_settings(JOBQUEUE={"DATABASE": queue_db}),
    ):
        with pytest.raises(Rollback), transaction.atomic():
            Order.objects.create(number="B-1")
            lost = jobqueue.enqueue("test.noop")
            raise Rollback
        assert lost.pk is None
        assert Job.objects.using(queue_db).count() == 0

        with transaction.atomic():
            Order.objects.create(number="B-2")
            upstream = jobqueue.enqueue("test.noop")
            assert upstream.pk is None
            assert Job.objects.using(queue_db).count() == 0
        assert upstream._state.db == queue_db
        assert Job.objects.using(queue_db).get(pk=upstream.pk).state == "ready"

        # A job loaded from the queue database is a valid dependency; one from 'default' is not.
        downstream = jobqueue.enqueue("test.noop", depends_on=[upstream])
        assert Job.objects.using(queue_db).get(pk=downstream.pk).state == "waiting"
        assert Job.objects.count() == 0  # nothing leaked onto 'default'
        elsewhere = JobFactory()
        with pytest.raises(jobqueue.InvalidDependencyError, match="lives on database"):
            jobqueue.enqueue("test.noop", depends_on=[elsewhere])
        assert Job.objects.using(queue_db).count() == 2


# --- dependencies ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_job_without_dependencies_is_ready() -> None:
    job = jobqueue.enqueue("test.noop")
    assert job.state == "ready"
    assert Job.objects.get(pk=job.pk).state == "ready"
    assert not JobDependency.objects.exists()


@pytest.mark.django_db
def test_dependency_on_an_unfinished_job_makes_a_waiting_job() -> None:
    a = jobqueue.enqueue("test.noop")
    b = JobFactory(state=Job.State.DONE, finished_at=timezone.now())
    c = jobqueue.enqueue("test.noop", depends_on=[a, b])
    assert c.state == "waiting"
    assert Job.objects.get(pk=c.pk).state == "waiting"
    edges = set(JobDependency.objects.filter(job=c).values_list("depends_on_id", flat=True))
    assert edges == {a.pk, b.pk}
    assert not Job.objects.ready().filter(pk=c.pk).exists()


@pytest.mark.parametrize(
    "state", [Job.State.READY, Job.State.LEASED, Job.State.RUNNING, Job.State.WAITING]
)
@pytest.mark.django_db
def test_any_upstream_not_done_keeps_the_job_waiting(state: str) -> None:
    extra: dict[str, Any] = {}
    if state in Job.LEASED_STATES:
        extra = {"lease_owner": "w", "lease_expires": timezone.now()}
    upstream = JobFactory(state=state, **extra)
    done = JobFactory(state=Job.State.DONE, finished_at=timezone.now())
    assert jobqueue.enqueue("test.noop", depends_on=[done, upstream]).state == "waiting"


@pytest.mark.django_db
def test_dependencies_all_done_make_a_ready_job() -> None:
    done = [JobFactory(state=Job.State.DONE, finished_at=timezone.now()) for _ in range(3)]
    job = jobqueue.enqueue("test.noop", depends_on=done)
    assert job.state == "ready"
    assert Job.objects.get(pk=job.pk).state == "ready"
    assert JobDependency.objects.filter(job=job).count() == 3


@pytest.mark.django_db
def test_dependencies_given_as_ids() -> None:
    a = jobqueue.enqueue("test.noop")
    b = jobqueue.enqueue("test.noop")
    job = jobqueue.enqueue("test.noop", depends_on=[a.pk, b.pk])
    assert job.state == "waiting"
    assert set(job.upstream_edges.values_list("depends_on_id", flat=True)) == {a.pk, b.pk}


@pytest.mark.django_db
def test_dependencies_from_any_iterable() -> None:
    a = jobqueue.enqueue("test.noop")
    b = jobqueue.enqueue("test.noop")
    job = jobqueue.enqueue("test.noop", depends_on=(j for j in [a, b]))
    assert job.upstream_edges.count() == 2
    job = jobqueue.enqueue("test.noop", depends_on=Job.objects.filter(pk__in=[a.pk, b.pk]))
    assert job.upstream_edges.count() == 2


@pytest.mark.django_db
def test_duplicate_dependencies_collapse() -> None:
    a = jobqueue.enqueue("test.noop")
    b = jobqueue.enqueue("test.noop")
    job = jobqueue.enqueue("test.noop", depends_on=[a, a.pk, b, a, b.pk])
    assert sorted(job.upstream_edges.values_list("depends_on_id", flat=True)) == sorted(
        [a.pk, b.pk]
    )


@pytest.mark.django_db
def test_parent_is_recorded_and_does_not_block() -> None:
    container = JobFactory(state=Job.State.WAITING, is_container=True)
    child = jobqueue.enqueue("test.noop", parent=container)
    assert child.state == "ready"
    assert Job.objects.get(pk=child.pk).parent_id == container.pk
    by_id = jobqueue.enqueue("test.noop", parent=container.pk)
    assert set(container.children.values_list("pk", flat=True)) == {child.pk, by_id.pk}


# --- what enqueue() stores -------------------------------------------------------------------


@pytest.mark.django_db
def test_enqueue_stores_every_option() -> None:
    when = timezone.now() + dt.timedelta(hours=1)
    job = jobqueue.enqueue(
        "test.add",
        {"a": 1, "b": [1.5, None, True, {"x": "é"}]},
        group="batch-7",
        weight=3,
        priority=-5,
        queue="emails",
        run_after=when,
        max_attempts=7,
        timeout=12.5,
    )
    stored = Job.objects.get(pk=job.pk)
    assert stored.args == {"a": 1, "b": [1.5, None, True, {"x": "é"}]}
    assert (stored.group_key, stored.weight, stored.priority, stored.queue) == (
        "batch-7",
        3,
        -5,
        "emails",
    )
    assert (stored.max_attempts, stored.timeout, stored.attempts) == (7, 12.5, 0)
    assert stored.run_after == when
    assert stored.lease_owner is None and stored.finished_at is None
    assert stored.created_at is not None


@pytest.mark.django_db
def test_enqueue_defaults_come_from_settings() -> None:
    job = jobqueue.enqueue("test.noop")
    assert (job.args, job.queue, job.max_attempts, job.timeout, job.priority, job.weight) == (
        {},
        "default",
        3,
        None,
        0,
        1,
    )
    assert job.group_key == "" and job.run_after is None
    with override_settings(JOBQUEUE={"DEFAULT_QUEUE": "bulk", "MAX_ATTEMPTS": 9, "TIMEOUT": 60}):
        job = jobqueue.enqueue("test.noop")
    stored = Job.objects.get(pk=job.pk)
    assert (stored.queue, stored.max_attempts, stored.timeout) == ("bulk", 9, 60.0)


@pytest.mark.django_db
def test_timeout_as_timedelta() -> None:
    job = jobqueue.enqueue("test.noop", timeout=dt.timedelta(minutes=2))
    stored = Job.objects.get(pk=job.pk)
    assert stored.timeout == 120.0
    assert stored.timeout_delta == dt.timedelta(minutes=2)


@pytest.mark.django_db
def test_run_after_delay_is_an_aware_datetime_near_the_database_clock() -> None:
    job = jobqueue.enqueue("test.noop", run_after=dt.timedelta(minutes=30))
    assert isinstance(job.run_after, dt.datetime) and timezone.is_aware(job.run_after)
    expected = timezone.now() + dt.timedelta(minutes=30)
    assert abs(job.run_after - expected) < dt.timedelta(minutes=1)
    assert Job.objects.get(pk=job.pk).run_after == job.run_after
    assert not Job.objects.ready().filter(pk=job.pk).exists()
    # The same path with dependencies (the write then runs in its own atomic block).
    upstream = jobqueue.enqueue("test.noop")
    waiting = jobqueue.enqueue("test.noop", depends_on=[upstream], run_after=dt.timedelta(0))
    assert timezone.is_aware(waiting.run_after)
    assert abs(waiting.run_after - timezone.now()) < dt.timedelta(minutes=1)


@pytest.mark.django_db
def test_run_after_in_the_past_or_now_is_ready_at_once() -> None:
    past = jobqueue.enqueue("test.noop", run_after=timezone.now() - dt.timedelta(minutes=1))
    now = jobqueue.enqueue("test.noop", run_after=dt.timedelta(seconds=-1))
    future = jobqueue.enqueue("test.noop", run_after=timezone.now() + dt.timedelta(minutes=1))
    ready = set(Job.objects.ready().values_list("pk", flat=True))
    assert past.pk in ready and now.pk in ready and future.pk not in ready


@pytest.mark.django_db
@pytest.mark.parametrize(
    "offset",
    [dt.timedelta(hours=-23), dt.timedelta(hours=16), dt.timedelta(microseconds=1)],
    ids=["minus-23h", "plus-16h", "one-microsecond"],
)
def test_run_after_with_any_offset_python_allows_is_stored_as_that_instant(
    offset: dt.timedelta,
) -> None:
    # PostgreSQL refuses offsets past +-15:59 and those with seconds: stored in UTC instead.
    when = dt.datetime(2030, 1, 1, tzinfo=dt.timezone(offset))
    job = jobqueue.enqueue("test.noop", run_after=when)
    assert job.run_after == when
    assert Job.objects.get(pk=job.pk).run_after == when


@pytest.mark.django_db
def test_enqueue_notifies_on_commit(
    django_capture_on_commit_callbacks: Any, wake_calls: list[tuple[str, str]]
) -> None:
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        jobqueue.enqueue("test.noop", queue="emails")
        upstream = jobqueue.enqueue("test.noop")
        jobqueue.enqueue("test.noop", depends_on=[upstream])
    assert len(callbacks) == 3
    assert wake_calls == [("default", "emails"), ("default", "default"), ("default", "default")]


@pytest.mark.django_db
def test_enqueue_issues_few_queries(django_assert_max_num_queries: Any) -> None:
    upstream = jobqueue.enqueue("test.noop")
    # In the caller's transaction (this test's): savepoint, insert, release; in autocommit
    # the insert alone.
    with django_assert_max_num_queries(3):
        jobqueue.enqueue("test.noop", {"a": 1})
    # savepoint, locked existence check, insert, edges, has_dependents on the upstream, release
    with django_assert_max_num_queries(6):
        jobqueue.enqueue("test.noop", depends_on=[upstream])


@pytest.mark.django_db(transaction=True)
def test_container_refuses_a_transaction_on_another_database(other_db: str) -> None:
    with (
        transaction.atomic(using=other_db),
        pytest.raises(jobqueue.InvalidJobError, match="cannot run inside a transaction"),
        jobqueue.container("batch"),
    ):
        pass
    assert Job.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_tasks_backend_writes_at_once_when_the_transaction_is_elsewhere(other_db: str) -> None:
    tasks = pytest.importorskip("tests.testapp.tasks")
    if not hasattr(tasks, "add"):
        pytest.skip("django.tasks needs Django 6.0+")
    with pytest.raises(Rollback), transaction.atomic(using=other_db):
        result = tasks.add.enqueue(1, 2)
        assert result.id != "None"
        raise Rollback
    assert Job.objects.filter(pk=int(result.id)).exists()  # not tied to the other database


@pytest.mark.django_db(transaction=True)
def test_bulk_insert_keeps_each_rows_own_values() -> None:
    """Columns that all rows share travel once; the others per row: each row reads back right."""
    when = dt.datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=dt.UTC)
    plain = jobqueue.enqueue_many(
        [("test.noop", {}), ("test.add", {"a": 1, "b": 2}), ("test.noop", None)]
    )
    assert [
        (j.type, j.args, j.state)
        for j in Job.objects.filter(pk__in=[p.pk for p in plain]).order_by("pk")
    ] == [
        ("test.noop", {}, "ready"),
        ("test.add", {"a": 1, "b": 2}, "ready"),
        ("test.noop", {}, "ready"),
    ]
    mixed = jobqueue.enqueue_many(
        [
            {"type": "test.noop", "priority": 5, "queue": "q1", "run_after": when},
            {"type": "test.add", "args": {"a": 3, "b": 4}, "group": "g", "weight": 3},
            {"type": "test.noop", "timeout": 2.5, "max_attempts": 7},
        ]
    )
    rows = {j.pk: j for j in Job.objects.filter(pk__in=[m.pk for m in mixed])}
    first, second, third = (rows[m.pk] for m in mixed)
    assert (first.priority, first.queue, first.run_after, first.state) == (
        5,
        "q1",
        when,
        "scheduled",
    )
    assert (second.args, second.group_key, second.weight, second.priority) == (
        {"a": 3, "b": 4},
        "g",
        3,
        0,
    )
    assert (third.timeout, third.max_attempts, third.queue) == (2.5, 7, "default")


@pytest.mark.django_db(transaction=True)
def test_a_bulk_enqueue_keeps_each_jobs_own_values_whichever_columns_vary() -> None:
    # The bulk INSERT sends a column that every job holds the same value of once, and the
    # others per job (Dialect._insert_document): each job must read back as it was given.
    later = timezone.now().replace(microsecond=0) + dt.timedelta(hours=1)
    specs: list[Any] = [
        {"type": "test.noop", "args": {"n": 0}, "priority": 1},
        {"type": "test.noop", "args": {"n": 1}, "priority": 1, "run_after": later},
        {"type": "test.noop", "args": {"n": 2}, "priority": 5, "queue": "other"},
        {"type": "test.noop", "args": {"n": 3}, "priority": 1, "group": "tenant-42"},
    ]
    jobs = jobqueue.enqueue_many(specs)
    stored = {
        job.pk: job
        for job in Job.objects.filter(pk__in=[j.pk for j in jobs]).only(
            "args", "priority", "queue", "run_after", "group_key", "state"
        )
    }
    assert len(stored) == 4
    for job, spec in zip(jobs, specs, strict=True):
        row = stored[job.pk]
        assert row.args == spec["args"]
        assert row.priority == spec["priority"]
        assert row.queue == spec.get("queue", "default")
        assert row.run_after == spec.get("run_after")
        assert row.group_key == spec.get("group", "")
        assert row.state == ("scheduled" if "run_after" in spec else "ready")


@pytest.mark.django_db
def test_a_bulk_enqueue_stores_each_value_as_the_orm_would() -> None:
    # Through the bulk INSERT's JSON document (JSON_TABLE on MariaDB, jsonb on PostgreSQL,
    # json_each on SQLite): text beyond ASCII, floats, a JSON column's None as SQL NULL and
    # its document as given, and the database's creation time. (Jobs with a unique key go
    # one by one: their conflicts are handled job by job.)
    from django.test import override_settings

    specs: list[Any] = [
        {"type": "test.noop", "args": {"name": "Zoë 😀 \"quoted\""}, "timeout": 2.5,
         "uses": {"tenant:1": 2}, "max_attempts": 1},
        {"type": "test.noop", "args": {"list": [1, None, True]}, "group": "Ünïcode"},
    ]  # fmt: skip
    before = timezone.now()
    with override_settings(JOBQUEUE={"LIMITS": {"tenant:*": {"concurrency": 5}}}):
        jobs = jobqueue.enqueue_many(specs)
    assert len({job.pk for job in jobs}) == 2
    first, second = (Job.objects.get(pk=job.pk) for job in jobs)
    assert first.args == specs[0]["args"] and second.args == specs[1]["args"]
    assert (first.timeout, second.timeout) == (2.5, None)
    assert (first.uses, second.uses) == ({"tenant:1": 2}, None)
    assert Job.objects.filter(pk=second.pk, uses__isnull=True).exists()
    assert (first.max_attempts, second.group_key) == (1, "Ünïcode")
    assert jobs[0].created_at == first.created_at and first.created_at >= before - dt.timedelta(
        seconds=5
    )


@pytest.mark.django_db
def test_a_bulk_enqueue_larger_than_a_statement_may_be_goes_in_parts(monkeypatch) -> None:
    # MySQL/MariaDB: one statement must fit the server's max_allowed_packet, so a document
    # over the budget goes in halves, each job still once and with its own values.
    from django.db import connection

    from django_jobqueue.dialects import get_dialect

    if connection.vendor != "mysql":
        pytest.skip("only MySQL/MariaDB bound a statement's size (max_allowed_packet)")
    weighed: list[int] = []  # each time a part's document is weighed against the budget
    monkeypatch.setattr(
        type(get_dialect("default")), "document_budget", lambda self: weighed.append(1) or 120
    )
    jobs = jobqueue.enqueue_many([("test.noop", {"n": n, "pad": "x" * 20}) for n in range(9)])
    assert len(weighed) > 3  # the halves were made
    stored = dict(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("pk", "args"))
    assert [stored[j.pk]["n"] for j in jobs] == list(range(9))


@pytest.mark.django_db
def test_the_bulk_insert_sends_once_only_values_equal_and_of_one_type() -> None:
    from django_jobqueue.dialects import get_dialect
    from django_jobqueue.engine.enqueuing import new_job

    jobs = [new_job(type="test.noop", args={}, priority=p) for p in (1, 1, 1)]
    jobs[2].priority = True  # equal to 1, of another type: it must travel per job
    found = get_dialect("default")._insert_document(jobs)
    assert found is not None
    priority = next(n for n, f in enumerate(found.fields) if f.attname == "priority")
    assert priority in found.varying and priority not in found.constants
    args = next(n for n, f in enumerate(found.fields) if f.attname == "args")
    assert found.constants[args] == "{}"
    jobs[0].args = ("not", "a", "document")  # a tuple: the generic path takes the jobs
    assert get_dialect("default")._insert_document(jobs) is None
