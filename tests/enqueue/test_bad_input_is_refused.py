"""Bad input is refused with a clear JobQueueError before anything is written, and the
caller's transaction stays usable; bad settings and worker options are check and command
errors, never a crash later (the reliability review: each failed on the earlier main)."""

from __future__ import annotations

import datetime as dt
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction
from django.test import override_settings
from django.utils.timezone import now

import django_jobqueue as jobqueue
from django_jobqueue import checks, validation
from django_jobqueue.exceptions import (
    InvalidArgumentsError,
    InvalidDependencyError,
    InvalidJobError,
)
from django_jobqueue.models import Job, Worker
from tests.support.extra_databases import sqlite_alias
from tests.testapp.models import RunRecord


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
    assert not Worker.objects.live().exists()
