"""A ready job whose row holds what no job may (written around enqueue(): a raw INSERT, another
program) ends `dead` with an UnreadableJob error that says why, and every other job runs: one
bad row never stops the claims, and the worker backs off only for the database's own errors."""

from __future__ import annotations

import json
import logging

import pytest
from django.db import connection

import django_jobqueue as jobqueue
from django_jobqueue.models import Job
from tests.conftest import assert_clean_log, poll
from tests.support.workflow_support import FAST, run_burst

pytestmark = pytest.mark.django_db(transaction=True)

LIMITS = {"tenant:*": {"concurrency": 5}, "api": {"rate": "1000/s"}}
VENDOR = connection.vendor

# (what is planted, column, its raw SQL value, the databases that can hold it)
BAD_USES = [
    # MariaDB's JSON_VALID, as PostgreSQL's jsonb, refuses a lone surrogate; SQLite's does not.
    ("a lone surrogate", "uses", '{"tenant:\\ud800": 1}', {"sqlite"}),
    ("a control character", "uses", '{"tenant:\\u001b": 1}', {"sqlite", "mysql", "postgresql"}),
    ("an inner star", "uses", '{"tenant:4*2": 1}', {"sqlite", "mysql", "postgresql"}),
    ("not a map", "uses", "[1, 2]", {"sqlite", "mysql", "postgresql"}),
    ("units that are text", "uses", '{"api": "x"}', {"sqlite", "mysql", "postgresql"}),
]
BAD_ROWS = [
    *BAD_USES,
    # Every JSON column refuses JSON that does not parse (a CHECK on SQLite and MariaDB); text
    # that is not UTF-8 is SQLite's alone.
    ("text that is not UTF-8", "group_key", "X'ff'", {"sqlite"}),
]


@pytest.fixture(autouse=True)
def limits(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "LIMITS": LIMITS}


def plant(job: Job, column: str, raw: str) -> None:
    """Write `raw` into the job's column as SQL, around enqueue() and the ORM."""
    table = connection.ops.quote_name(Job._meta.db_table)
    value = "CAST(X'ff' AS TEXT)" if raw == "X'ff'" else "%s"
    params = [] if raw == "X'ff'" else [raw]
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET {column} = {value} WHERE id = %s", [*params, job.pk])


def good_jobs() -> list[Job]:
    return [
        *(jobqueue.enqueue("limits.work", uses={f"tenant:{n}": 1}) for n in range(4)),
        *(jobqueue.enqueue("limits.work", uses={"api": 1}) for _ in range(3)),
        *(jobqueue.enqueue("limits.work") for _ in range(3)),
    ]


def assert_set_aside(bad: Job, what: str) -> None:
    row = Job.objects.filter(pk=bad.pk).values_list("state", "last_error", "attempts").get()
    state, error, attempts = row
    assert state == "dead", (what, row)
    assert error["type"] == "django_jobqueue.exceptions.UnreadableJob", error
    assert "no claim can start this job" in error["message"], error
    assert attempts == 0  # it never ran


@pytest.mark.parametrize(
    ("what", "column", "raw", "vendors"), BAD_ROWS, ids=[r[0] for r in BAD_ROWS]
)
def test_a_bad_row_is_set_aside_and_every_other_job_runs(caplog, what, column, raw, vendors):
    if VENDOR not in vendors:
        pytest.skip(f"{VENDOR} cannot hold {what}")
    # The bad job first (claimed first), with a dependent that its death cancels.
    bad = jobqueue.enqueue("limits.work", uses={"tenant:x": 1}, priority=10)
    after = jobqueue.enqueue("limits.work", depends_on=[bad])
    plant(bad, column, raw)
    good = good_jobs()
    with caplog.at_level(logging.WARNING):
        assert run_burst(concurrency=4) == 0
    assert_set_aside(bad, what)
    assert Job.objects.get(pk=after.pk).state == "cancelled"
    states = dict(Job.objects.filter(pk__in=[j.pk for j in good]).values_list("pk", "state"))
    assert set(states.values()) == {"done"}, states
    # No back-off: the worker never took the bad row for the database's trouble.
    assert "Database error in the worker loop" not in caplog.text
    assert "Unexpected error in the dispatcher" not in caplog.text


def test_a_worker_process_sets_a_bad_row_aside_and_runs_the_rest(start_worker):
    bad = jobqueue.enqueue("limits.work", uses={"tenant:x": 1}, priority=10)
    planted = [(w, c, r) for w, c, r, v in BAD_ROWS if VENDOR in v]
    what, column, raw = planted[0]
    plant(bad, column, raw)
    good = good_jobs()
    worker = start_worker(
        "--concurrency", "4", *FAST, env={"JOBQUEUE_TEST_LIMITS": json.dumps(LIMITS)}
    )
    ids = [j.pk for j in good]
    poll(lambda: Job.objects.filter(pk__in=ids, state="done").count() == len(ids), timeout=60)
    poll(lambda: Job.objects.get(pk=bad.pk).state == "dead", timeout=30)
    assert_set_aside(bad, what)
    assert worker.stop() == 0, worker.output()
    assert "set aside" in worker.output().lower(), worker.output()
    assert "Database error in the worker loop" not in worker.output()
    assert_clean_log(worker.output())
