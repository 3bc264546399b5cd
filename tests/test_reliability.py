"""Regression tests of the reliability review: bad input refused before any write, outcomes
that cannot be stored, rolling deploys, the inbox helper. Each failed on the earlier main."""

from __future__ import annotations

import datetime as dt
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.test import override_settings
from django.utils.timezone import now

import django_jobqueue as jobqueue
from django_jobqueue import checks, error_records, validation
from django_jobqueue.exceptions import (
    InvalidArgumentsError,
    InvalidDependencyError,
    InvalidJobError,
    JobQueueError,
)
from django_jobqueue.models import Effect, Job, Worker
from tests.conftest import wait_for_job
from tests.extra_databases import sqlite_alias
from tests.testapp.models import RunRecord

TERMINAL = (Job.State.DONE, Job.State.DEAD)


def usable() -> bool:
    """Whether the current transaction still runs queries (it is not marked for rollback)."""
    return RunRecord.objects.count() >= 0


# -- bad input: refused with a JobQueueError, nothing written, the transaction usable ---------

PLUS5 = dt.timezone(dt.timedelta(hours=5))
MINUS5 = dt.timezone(dt.timedelta(hours=-5))

BAD_ENQUEUES = [
    ("run_after-min", {"run_after": dt.datetime.min.replace(tzinfo=PLUS5)}, InvalidJobError),
    ("run_after-max", {"run_after": dt.datetime.max.replace(tzinfo=MINUS5)}, InvalidJobError),
    ("run_after-year-1", {"run_after": dt.datetime(1, 1, 2, tzinfo=dt.UTC)}, InvalidJobError),
    ("delay-huge", {"run_after": dt.timedelta(days=999_999)}, InvalidJobError),
    ("delay-negative-huge", {"run_after": dt.timedelta(days=-999_999)}, InvalidJobError),
    ("naive", {"run_after": dt.datetime(2030, 1, 1)}, InvalidJobError),
    ("int-5000-digits", {"args": {"n": 10**5000}}, InvalidArgumentsError),
    ("args-too-big", {"args": {"s": "x" * 1_100_000}}, InvalidArgumentsError),
    ("float-2**55", {"args": {"f": 3.602879701896397e16}}, InvalidArgumentsError),
    ("max_attempts-huge", {"max_attempts": 2**40}, InvalidJobError),
    ("depends_on-huge-id", {"depends_on": [2**70]}, InvalidDependencyError),
]


@pytest.mark.parametrize(
    ("options", "error"), [(o, e) for _, o, e in BAD_ENQUEUES], ids=[n for n, _, _ in BAD_ENQUEUES]
)
@pytest.mark.django_db
def test_bad_input_is_refused_before_any_write(options: dict[str, Any], error: type) -> None:
    with transaction.atomic():
        RunRecord.objects.create(job_id=0, attempt=1)
        with pytest.raises(error):
            jobqueue.enqueue("test.noop", **options)
        assert usable()
    assert Job.objects.count() == 0


@pytest.mark.django_db
def test_cyclic_and_deep_args_are_invalid_arguments() -> None:
    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic
    deep: list[Any] = []
    for _ in range(sys.getrecursionlimit() * 2):
        deep = [deep]
    for args in ({"c": cyclic}, {"d": deep}):
        with pytest.raises(InvalidArgumentsError, match="nested too deeply"):
            jobqueue.enqueue("test.noop", args)
    assert Job.objects.count() == 0


@pytest.mark.django_db
def test_args_limit_is_a_setting(settings: Any) -> None:
    settings.JOBQUEUE = {"MAX_ARGS_BYTES": 100}
    with pytest.raises(InvalidArgumentsError, match="over the limit of 100"):
        jobqueue.enqueue("test.noop", {"s": "x" * 200})
    assert jobqueue.enqueue("test.noop", {"s": "x" * 50}).pk


@pytest.mark.django_db(transaction=True)
def test_run_after_at_the_ends_of_the_range_round_trips() -> None:
    low = validation.RUN_AFTER_MIN
    high = validation.RUN_AFTER_MAX - dt.timedelta(seconds=1)
    for when in (low, high):
        job = jobqueue.enqueue("test.noop", run_after=when)
        job.refresh_from_db()
        assert job.run_after == when


@pytest.fixture
def other_db(tmp_path: Path) -> Iterator[str]:
    with sqlite_alias("other", tmp_path / "other.sqlite3") as alias:
        yield alias


@pytest.mark.django_db(transaction=True)
def test_bad_input_is_refused_before_a_commit_on_another_database(other_db: str) -> None:
    """The caller's transaction is on another alias: errors come now, not after its commit."""
    with transaction.atomic(using=other_db):
        with pytest.raises(InvalidArgumentsError):
            jobqueue.enqueue("test.noop", {"n": 10**5000})
        with pytest.raises(InvalidJobError):
            jobqueue.enqueue("test.noop", run_after=dt.datetime.max.replace(tzinfo=MINUS5))
    assert Job.objects.count() == 0


@pytest.mark.django_db
def test_retry_refuses_budgets_and_ids_out_of_range() -> None:
    job = Job.objects.create(
        type="test.noop", state=Job.State.DEAD, attempts=3, max_attempts=3, finished_at=now()
    )
    with pytest.raises(InvalidJobError, match="more fit"):
        jobqueue.retry(job, extra_attempts=2**31 - 3)
    with pytest.raises(InvalidJobError, match="does not exist"):
        jobqueue.retry(2**70)
    with pytest.raises(InvalidJobError, match="does not exist"):
        jobqueue.cancel(-5)
    job.refresh_from_db()
    assert (job.state, job.max_attempts) == (Job.State.DEAD, 3)


@pytest.mark.django_db
def test_enqueue_many_refuses_bad_specs_with_invalid_job_error() -> None:
    for specs in (
        [("test.noop", {}, "extra")],
        [{"type": "test.noop", "colour": "red"}],
        [{"args": {}}],
        [42],
        "test.noop",
    ):
        with pytest.raises(InvalidJobError):
            jobqueue.enqueue_many(specs)  # type: ignore[arg-type]
    assert Job.objects.count() == 0


@pytest.mark.django_db
def test_enqueue_many_takes_unique_key_as_enqueue_does() -> None:
    first = jobqueue.enqueue("test.noop", unique_key="k1")
    jobs = jobqueue.enqueue_many(
        [
            ("test.add", {"a": 1, "b": 2}),
            {"type": "test.noop", "unique_key": "k1"},
            {"type": "test.noop", "unique_key": "k2"},
        ]
    )
    assert jobs[1].pk == first.pk
    assert jobs[2].unique_key == "k2"
    assert Job.objects.count() == 3


@pytest.mark.django_db
def test_enqueue_many_with_a_bad_unique_spec_writes_nothing() -> None:
    with pytest.raises(InvalidJobError):
        jobqueue.enqueue_many(
            [("test.noop", {}), {"type": "test.noop", "unique_key": "k", "weight": 0}]
        )
    assert Job.objects.count() == 0


@pytest.mark.django_db
def test_graph_add_with_a_timedelta_raises_invalid_job_error() -> None:
    with pytest.raises(InvalidJobError, match="datetime"), jobqueue.graph() as g:
        g.add("test.noop", run_after=dt.timedelta(seconds=5))  # type: ignore[arg-type]
    assert Job.objects.count() == 0


# -- settings and options ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "jobqueue_setting",
    [
        {1: 2},
        {"DATABASE": ["default"]},
        {"SHUTDOWN_TIMEOUT": math.nan},
        {"SHUTDOWN_TIMEOUT": math.inf},
        {"POLL_INTERVAL": math.nan},
        {"LEASE_TTL": math.inf},
        {"GROUP_LIMITS": {"g" * 300: 1}},
        {"GROUP_LIMITS": {"g": 2**40}},
        {"MAX_ARGS_BYTES": 0},
    ],
    ids=repr,
)
def test_bad_settings_are_a_check_error_not_a_crash(jobqueue_setting: dict[Any, Any]) -> None:
    with override_settings(JOBQUEUE=jobqueue_setting):
        found = checks.check_settings()
    assert [m.id for m in found] == ["django_jobqueue.E001"]


def test_a_dynamic_limit_that_does_not_import_is_a_check_error() -> None:
    with override_settings(JOBQUEUE={"DYNAMIC_LIMIT": "tests.nowhere.limit"}):
        found = checks.check_settings()
    assert [m.id for m in found] == ["django_jobqueue.E004"]
    with override_settings(JOBQUEUE={"DYNAMIC_LIMIT": "tests.settings.DATABASES"}):
        assert [m.id for m in checks.check_settings()] == ["django_jobqueue.E004"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--poll-interval", "nan"],
        ["--lease-ttl", "inf"],
        ["--heartbeat-interval", "-inf"],
        ["--shutdown-timeout", "nan"],
        ["--worker-id", "w" * 256],
    ],
    ids=" ".join,
)
@pytest.mark.django_db
def test_bad_worker_options_are_a_command_error(argv: list[str]) -> None:
    with pytest.raises(CommandError):
        call_command("jobqueue_worker", *argv, "--burst")
    assert not Worker.objects.exists()


# -- outcomes that cannot be stored, error records ---------------------------------------------


@pytest.mark.parametrize("kind", ["nul", "surrogate", "big"])
@pytest.mark.django_db(transaction=True)
def test_a_result_no_database_can_store_kills_the_attempt_at_once(start_worker, kind: str):
    job = jobqueue.enqueue("test.unstorable_result", {"kind": kind}, max_attempts=3)
    worker = start_worker("--poll-interval", "0.05")
    dead = wait_for_job(job.pk, *TERMINAL)
    assert worker.stop() == 0
    assert dead.state == Job.State.DEAD
    assert dead.attempts == 1  # not run again, and not taken for a lost lease
    assert dead.last_error["type"] == "django_jobqueue.exceptions.ResultNotStored"
    assert "cannot store its result" in dead.last_error["message"]
    assert dead.result is None


@pytest.mark.django_db(transaction=True)
def test_an_error_message_no_database_can_store_is_cleaned_and_cut(start_worker):
    job = jobqueue.enqueue("test.nasty_error", max_attempts=2)
    worker = start_worker("--poll-interval", "0.05")
    dead = wait_for_job(job.pk, *TERMINAL, timeout=90)
    assert worker.stop() == 0
    assert dead.state == Job.State.DEAD
    assert dead.attempts == 2  # a failure like any other: retried, then dead
    message = dead.last_error["message"]
    assert message.startswith("badbyte \\udc80 y")
    assert "\x00" not in message
    assert len(message) < error_records.MAX_ERROR_MESSAGE + 100
    assert len(dead.last_error["traceback"]) < error_records.MAX_ERROR_TRACEBACK + 100
    assert len(dead.errors) == 2


def test_the_error_history_keeps_the_latest_entries() -> None:
    history: list[dict[str, Any]] = []
    for attempt in range(1, 100):
        history = error_records.with_error(history, {"attempt": attempt})
    assert len(history) == error_records.MAX_ERROR_HISTORY
    assert history[-1] == {"attempt": 99}


# -- rolling deploys ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_job_of_a_newer_release_waits_for_a_worker_that_has_its_handler(start_worker):
    """An old worker must not kill the jobs of a new release: it leaves them ready."""
    newer = Job.objects.create(type="test.new_release", args={}, max_attempts=1)
    old = start_worker("--poll-interval", "0.05")
    old.wait_registered()
    marker = jobqueue.enqueue("test.add", {"a": 1, "b": 1})
    assert wait_for_job(marker.pk, *TERMINAL).state == Job.State.DONE
    newer.refresh_from_db()
    assert (newer.state, newer.attempts) == (Job.State.READY, 0)
    assert "test.new_release" not in old.row().handlers
    warnings = checks.check_database(databases=[connection.alias])
    assert [m.id for m in warnings] == ["django_jobqueue.W005"]
    assert "test.new_release" in warnings[0].msg

    new = start_worker("--poll-interval", "0.05", env={"JOBQUEUE_TEST_NEW_RELEASE": "1"})
    done = wait_for_job(newer.pk, *TERMINAL)
    assert (done.state, done.result, done.attempts) == (Job.State.DONE, "new", 1)
    assert old.stop() == 0
    assert new.stop() == 0


# -- the Tasks backend reads results without importing what a row names ------------------------


@pytest.mark.django_db
def test_get_result_of_a_forged_row_imports_nothing() -> None:
    backends = pytest.importorskip("django_jobqueue.backends")
    if not backends.HAS_TASKS:
        pytest.skip("django.tasks needs Django 6.0+")
    from django.tasks import task_backends
    from django.tasks.exceptions import TaskResultDoesNotExist

    forged = Job.objects.create(
        type=backends.task_key("default", "tests.unlisted_tasks.side_effect")
    )
    assert "tests.unlisted_tasks" not in sys.modules
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(str(forged.pk))
    assert "tests.unlisted_tasks" not in sys.modules


# -- record_effect(): the inbox ----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_record_effect_is_true_once_per_committed_key() -> None:
    with transaction.atomic():
        assert jobqueue.record_effect("charge:1")
        RunRecord.objects.create(job_id=1, attempt=1)
    with transaction.atomic():  # a re-run: the effect committed, skip it
        assert not jobqueue.record_effect("charge:1")
        assert usable()
    assert RunRecord.objects.filter(job_id=1).count() == 1


@pytest.mark.django_db(transaction=True)
def test_record_effect_rolls_back_with_the_writes_it_guards() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        assert jobqueue.record_effect("charge:2")
        raise RuntimeError("the handler failed before its commit")
    with transaction.atomic():
        assert jobqueue.record_effect("charge:2")  # nothing committed: do it now
    assert Effect.objects.filter(key="charge:2").count() == 1


@pytest.mark.django_db(transaction=True)
def test_record_effect_outside_a_transaction_is_an_error() -> None:
    with pytest.raises(JobQueueError, match="inside"):
        jobqueue.record_effect("charge:3")
    assert not Effect.objects.exists()


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
def test_container_waits_for_sqlites_write_lock_instead_of_failing(tmp_path: Path) -> None:
    """Fix: container() ran in a plain (DEFERRED on SQLite) transaction: it read the parent,
    then failed with 'database is locked' when another writer committed meanwhile, instead of
    starting with BEGIN IMMEDIATE (and retrying) like every other write."""
    import sqlite3
    import threading
    import time as time_module

    path = tmp_path / "queue.sqlite3"
    with (
        sqlite_alias("deferred_queue", path, migrate=True) as alias,
        override_settings(JOBQUEUE={"DATABASE": alias}),
    ):
        outer = Job.objects.using(alias).create(
            type="outer", is_container=True, sealed=False, state=Job.State.WAITING
        )
        holding = threading.Event()

        def write_meanwhile() -> None:
            other = sqlite3.connect(path, timeout=10)
            other.execute("BEGIN IMMEDIATE")
            other.execute("UPDATE django_jobqueue_job SET priority = 1 WHERE id = ?", (outer.pk,))
            holding.set()
            time_module.sleep(0.5)
            other.commit()
            other.close()

        thread = threading.Thread(target=write_meanwhile)
        thread.start()
        assert holding.wait(10)
        with jobqueue.container("inner", parent=outer) as inner:
            pass
        thread.join(10)
        assert Job.objects.using(alias).get(pk=inner.pk).parent_id == outer.pk
