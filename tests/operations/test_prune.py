"""jobqueue_prune: only what no unfinished job needs goes, in bounded batches; bad options."""

from __future__ import annotations

import datetime as dt
import json
import re
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import django_jobqueue as jobqueue
from django_jobqueue import conf, pruning
from django_jobqueue.dialects import get_dialect
from django_jobqueue.models import Job, JobDependency, JobMap
from django_jobqueue.testing import run_jobs
from tests.conftest import poll
from tests.dialects.test_explain import analyze, explain_sql, job_statements, statements_of
from tests.support.markers import needs_skip_locked

pytestmark = pytest.mark.django_db(transaction=True)
FINAL = Job.TERMINAL_STATES


def make(
    state: str = Job.State.DONE,
    days: float = 10,
    *,
    parent: Job | None = None,
    container: bool = False,
    depends_on: tuple[Job, ...] = (),
    **extra: Any,
) -> Job:
    """A job row in `state`, finished `days` ago when final."""
    finished = timezone.now() - dt.timedelta(days=days) if state in FINAL else None
    job = Job.objects.create(
        type="test.noop",
        state=state,
        finished_at=finished,
        parent=parent,
        is_container=container,
        sealed=container,
        unique_slot=None if state in FINAL else 1,
        **extra,
    )
    for upstream in depends_on:
        JobDependency.objects.create(job=job, depends_on=upstream)
        Job.objects.filter(pk=upstream.pk).update(has_dependents=True)
    return job


def prune(*args: str) -> str:
    out = StringIO()
    call_command("jobqueue_prune", *args, stdout=out)
    return out.getvalue()


def alive(*jobs: Job) -> list[bool]:
    existing = set(Job.objects.values_list("pk", flat=True))
    return [job.pk in existing for job in jobs]


def test_prune_keeps_what_a_live_dag_needs():
    feeds = make(Job.State.DONE)  # an unfinished job depends on it
    waiting = make(Job.State.WAITING, depends_on=(feeds,))
    up = make(Job.State.DONE)
    down = make(Job.State.DONE, depends_on=(up,))
    failed_up = make(Job.State.DONE)
    cancelled = make(Job.State.CANCELLED, depends_on=(failed_up,))
    dead = make(Job.State.DEAD)
    recent = make(Job.State.DONE, days=0.5)
    open_box = make(Job.State.WAITING, container=True)
    child_of_open = make(Job.State.DONE, parent=open_box)
    box = make(Job.State.DONE, days=9, container=True)
    children = [make(Job.State.DONE, days=9.5, parent=box) for _ in range(3)]
    # Cancelled first, its running child finished later: a second pass takes the container.
    early_box = make(Job.State.CANCELLED, days=12, container=True)
    late_child = make(Job.State.CANCELLED, days=11, parent=early_box)
    running = make(Job.State.RUNNING, lease_owner="w", lease_expires=timezone.now())

    out = prune("--older-than", "7d")

    assert alive(feeds, waiting, dead, recent, open_box, child_of_open, running) == [True] * 7
    gone = [up, down, failed_up, cancelled, box, *children, early_box, late_child]
    assert alive(*gone) == [False] * len(gone)
    assert JobDependency.objects.filter(depends_on=feeds, job=waiting).exists()
    assert JobDependency.objects.count() == 1
    assert "Deleted 10 job(s) (7 done, 3 cancelled)" in out, out  # both passes counted


def test_dead_is_pruned_only_when_named_and_references_are_cleared():
    root = make(Job.State.DEAD)
    victim = make(Job.State.CANCELLED, days=0, cancelled_by=root)
    done = make(Job.State.DONE)
    prune("--older-than", "1d")
    assert alive(root, victim, done) == [True, True, False]
    prune("--older-than", "1d", "--state", "dead")
    assert alive(root, victim) == [False, True]
    victim.refresh_from_db()
    assert victim.cancelled_by_id is None


def test_dry_run_deletes_nothing():
    jobs = [make(Job.State.DONE) for _ in range(4)]
    out = prune("--older-than", "7d", "--dry-run")
    assert "Would delete 4 job(s)" in out
    assert alive(*jobs) == [True] * 4


def test_batches_are_bounded_short_transactions():
    jobs = [make(Job.State.DONE) for _ in range(23)]
    deletes: list[str] = []
    table = Job._meta.db_table
    with CaptureQueriesContext(connection) as queries:
        out = prune("--older-than", "7d", "--batch-size", "5")
    for query in queries.captured_queries:
        sql = query["sql"]
        if sql.upper().startswith("DELETE") and re.search(rf'FROM [`"]?{table}[`"]?\s', sql):
            deletes.append(sql)
    assert alive(*jobs) == [False] * 23
    assert len(deletes) == 5, deletes  # ceil(23 / 5): one DELETE of the rows per batch
    assert "in 5 batch(es)" in out
    # Each batch read at most 5 candidates (LIMIT 5) and deleted what it read.
    assert re.findall(r"done: deleted (\d+) of (\d+)", out) == [("5", "5")] * 4 + [("3", "3")]
    assert all("LIMIT 5" in q["sql"] for q in queries.captured_queries if "ORDER BY" in q["sql"])


def test_prune_batch_moves_its_cursor_and_reports():
    for _ in range(3):
        make(Job.State.DONE)
    cursor = pruning.Cursor()
    dialect = get_dialect("default")
    first = pruning.prune_batch(
        dialect, state="done", older_than=dt.timedelta(days=1), cursor=cursor, batch_size=2
    )
    assert (first.scanned, first.deleted, first.done) == (2, 2, False)
    second = pruning.prune_batch(
        dialect, state="done", older_than=dt.timedelta(days=1), cursor=cursor, batch_size=2
    )
    assert (second.scanned, second.deleted, second.done) == (1, 1, True)
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--older-than", "7"], "not an age"),
        (["--older-than", "7w"], "not an age"),
        (["--older-than=-1d"], "not an age"),
        (["--older-than", "7d", "--state", "ready"], "not a final state"),
        (["--older-than", "7d", "--state", "nonsense"], "not a final state"),
        (["--older-than", "7d", "--batch-size", "0"], "--batch-size"),
        (["--older-than", "7d", "--batch-size", "x"], "--batch-size"),
        (["--older-than", "7d", "--batch-size", "100000"], "--batch-size"),
        ([], "--older-than"),
    ],
)
def test_bad_options_fail_before_anything_is_deleted(args, message):
    job = make(Job.State.DONE)
    with pytest.raises(CommandError, match=re.escape(message)):
        prune(*args)
    assert alive(job) == [True]


def test_tune_postgres(settings):
    if connection.vendor != "postgresql":
        with pytest.raises(CommandError, match="needs PostgreSQL"):
            prune("--tune-postgres")
        return
    out = prune("--tune-postgres", "--dry-run")
    assert "fillfactor = 80" in out
    prune("--tune-postgres")
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = %s", [Job._meta.db_table])
        (options,) = cursor.fetchone()
    assert "fillfactor=80" in options
    assert "autovacuum_vacuum_scale_factor=0.01" in options


def test_without_older_than_retention_gives_the_ages(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "RETENTION": {"done": "2d", "dead": None}}
    old, young = make(Job.State.DONE, days=3), make(Job.State.DONE, days=1)
    cancelled = make(Job.State.CANCELLED, days=30)
    prune()
    assert alive(old, young, cancelled) == [False, True, True]


@pytest.mark.parametrize(
    "retention",
    [{"ready": "1d"}, {"done": "soon"}, {"done": -5}, ["done"], {"done": True}],
)
def test_bad_retention_is_a_configuration_error(retention, settings):
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match="RETENTION"):
        conf.load({"RETENTION": retention})


def test_parse_age_units():
    assert conf.parse_age("90s") == dt.timedelta(seconds=90)
    assert conf.parse_age("15m") == dt.timedelta(minutes=15)
    assert conf.parse_age("1.5h") == dt.timedelta(minutes=90)
    assert conf.parse_age("7d") == dt.timedelta(days=7)
    assert conf.parse_age(3600) == dt.timedelta(hours=1)


def test_workers_apply_retention(start_worker):
    old = [make(Job.State.DONE, days=3) for _ in range(5)]
    needed = make(Job.State.DONE, days=3)
    waiting = make(Job.State.WAITING, depends_on=(needed,))
    old_dead = make(Job.State.DEAD, days=3)
    young = make(Job.State.DONE, days=0.5)
    retention = {"done": "2d", "cancelled": "2d", "dead": None}
    worker = start_worker(env={"JOBQUEUE_TEST_RETENTION": json.dumps(retention)})
    worker.wait_registered()
    poll(lambda: alive(*old) == [False] * 5, timeout=60)
    assert alive(needed, waiting, old_dead, young) == [True] * 4
    assert worker.stop() == 0, worker.output()
    assert "Pruned 5 done job(s)" in worker.output()


def test_pruner_duty_deletes_one_bounded_batch_per_tick():
    from django_jobqueue.worker.pruner import BUSY_INTERVAL, Pruner

    for _ in range(5):
        make(Job.State.DONE, days=3)
    pruner = Pruner(
        get_dialect("default"),
        ages={"done": dt.timedelta(days=1)},
        lock_timeout=5,
        batch_size=2,
        max_batch_size=2,
    )
    assert pruner.tick() <= BUSY_INTERVAL
    assert Job.objects.count() == 3
    assert pruner.tick() <= BUSY_INTERVAL
    # The pass ended, having deleted rows: more may pass their age soon, look again in a second.
    assert pruner.tick() == BUSY_INTERVAL
    assert pruner.tick() > BUSY_INTERVAL  # a pass that found nothing: back to the slow pace
    assert Job.objects.count() == 0


def test_a_pruner_that_found_nothing_comes_back_when_the_next_job_is_old_enough():
    """Not a whole PRUNE_INTERVAL later: the first pass after a quiet start would meet up to a
    minute of rows at once. Rows kept past their age (here: one a pending job depends on) do
    not make it come back at once."""
    from django_jobqueue.models.functions import DbNow
    from django_jobqueue.worker.pruner import PRUNE_INTERVAL, Pruner

    dialect = get_dialect("default")
    ages = {"done": dt.timedelta(seconds=40)}
    pruner = Pruner(dialect, ages=ages, lock_timeout=5)
    assert pruner.tick() == pytest.approx(40, rel=0.21)  # none finished: the age, at most
    kept = make(Job.State.DONE, days=1)
    make(Job.State.READY, depends_on=(kept,))
    young = make(Job.State.DONE)
    # Finished 10 s ago by the database clock: old enough in 30 s (not at once, for the kept
    # row, nor a whole interval later).
    Job.objects.filter(pk=young.pk).update(finished_at=DbNow() - dt.timedelta(seconds=10))
    wait = pruner.tick()
    assert 20 < wait <= 30 * 1.2, wait
    assert alive(kept, young) == [True, True]
    # Its interval, at most.
    long_ages = {"done": dt.timedelta(days=7)}
    assert Pruner(dialect, ages=long_ages, lock_timeout=5).tick() <= PRUNE_INTERVAL * 1.2


def test_prune_batches_read_the_state_finished_index():
    """Each batch's candidates come from the (state, finished_at) index, also past a cursor."""
    now = timezone.now()
    Job.objects.bulk_create(
        (
            Job(type="test.noop", state=state, finished_at=now - dt.timedelta(seconds=i))
            for i in range(3000)
            for state in (Job.State.DONE, Job.State.DEAD)
        ),
        batch_size=500,
    )
    Job.objects.bulk_create(Job(type="test.noop", state=Job.State.READY) for _ in range(50))
    analyze()
    dialect = get_dialect("default")
    cursor = pruning.Cursor()

    def batch() -> None:
        pruning.prune_batch(
            dialect,
            state="done",
            older_than=dt.timedelta(seconds=100),
            cursor=cursor,
            batch_size=100,
        )

    for _ in range(2):  # the first batch, then one that starts at the cursor
        statements = statements_of(batch)
        [select] = [s for s in job_statements(statements, "SELECT") if "ORDER BY" in s]
        used, _, plan = explain_sql(select)
        assert "jobqueue_job_state_finished" in used, plan
    assert cursor.finished_at is not None


@needs_skip_locked("SQLite serializes writers: there is no row lock to skip")
def test_a_row_locked_elsewhere_is_skipped_not_waited_for():
    import threading

    from django.db import connections, transaction

    held, kept = make(Job.State.DONE), make(Job.State.DONE)
    others = [make(Job.State.DONE) for _ in range(3)]
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                list(Job.objects.select_for_update().filter(pk=held.pk))
                locked.set()
                release.wait(60)
        finally:
            connections.close_all()

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert locked.wait(30)
        out = prune("--older-than", "1d")
    finally:
        release.set()
        thread.join(60)
    assert alive(held, kept, *others) == [True, False, False, False, False]
    assert "Deleted 4 job(s)" in out


def test_prune_and_stats_use_the_queue_database(tmp_path, settings):
    from tests.support.extra_databases import sqlite_alias

    with sqlite_alias("queue", tmp_path / "queue.sqlite3", migrate=True):
        settings.JOBQUEUE = {**settings.JOBQUEUE, "DATABASE": "queue"}
        finished = timezone.now() - dt.timedelta(days=3)
        Job.objects.using("queue").create(
            type="test.noop", state="done", finished_at=finished, unique_slot=None
        )
        Job.objects.using("queue").create(type="test.noop", state="ready")
        here = make(Job.State.DONE, days=3)  # on "default": not the queue's
        out = StringIO()
        call_command("jobqueue_stats", "--json", stdout=out)
        assert json.loads(out.getvalue())["states"]["done"] == 1
        assert json.loads(out.getvalue())["states"]["ready"] == 1
        assert "Deleted 1 job(s)" in prune("--older-than", "1d")
        assert not Job.objects.using("queue").filter(state="done").exists()
        assert alive(here) == [True]


def test_pruner_batches_grow_while_a_backlog_remains_and_stay_within_bounds(monkeypatch):
    from django_jobqueue.worker import pruner as pruner_module
    from django_jobqueue.worker.pruner import BUSY_INTERVAL, MIN_PAUSE, Pruner

    # Every batch counts as quick, however loaded the machine: the doubling is under test
    # here, not the machine's speed (a batch of 4 rows once took over FAST under CI load).
    monkeypatch.setattr(pruner_module, "FAST", 60.0)
    monkeypatch.setattr(pruner_module, "SLOW", 120.0)

    for _ in range(40):
        make(Job.State.DONE, days=3)
    pruner = Pruner(
        get_dialect("default"),
        ages={"done": dt.timedelta(days=1)},
        lock_timeout=5,
        batch_size=2,
        max_batch_size=16,
    )
    sizes, pauses = [], []
    while Job.objects.exists():
        sizes.append(pruner.batch_size)
        pauses.append(pruner.tick())
    # Quick full batches double up to the ceiling: 2 + 4 + 8 + 16 + 16 > 40 rows.
    assert sizes[:4] == [2, 4, 8, 16]
    assert max(sizes) == 16
    assert all(MIN_PAUSE <= p <= BUSY_INTERVAL for p in pauses[:-1])


def test_a_batch_of_deletes_reads_no_whole_table():
    """Each statement of a 1000-row delete goes through an index: on MariaDB an IN list of
    over 200 ids was estimated from the statistics of the all-NULL cancelled_by column, and
    the update of its references scanned the whole table."""
    now = timezone.now()
    Job.objects.bulk_create(
        (
            Job(type="test.noop", state=Job.State.DONE, finished_at=now - dt.timedelta(days=3))
            for _ in range(3000)
        ),
        batch_size=500,
    )
    analyze()
    dialect = get_dialect("default")
    ids = list(Job.objects.order_by("pk").values_list("pk", flat=True)[:1000])
    statements = statements_of(lambda: pruning.delete_jobs(dialect, ids))
    plans = [explain_sql(sql)[2] for sql in job_statements(statements)]
    assert plans, statements
    for plan in plans:
        if connection.vendor == "mysql":
            assert "'type': 'ALL'" not in plan and "'type': 'index'" not in plan, plan
        elif connection.vendor == "postgresql":
            assert "Seq Scan" not in plan, plan
        else:
            assert not re.search(r"\bSCAN django_jobqueue_job\b(?! USING)", plan), plan


def test_prune_deletes_a_job_that_mapped_with_its_map_rows():
    """A job that called ctx.map() has JobMap rows: they go with it (their foreign key
    refused the delete before)."""
    parent = jobqueue.enqueue("map.parent", {"items": [1, 2]})
    run_jobs()
    assert JobMap.objects.filter(job_id=parent.pk).exists()
    Job.objects.update(finished_at=timezone.now() - dt.timedelta(days=3))
    prune("--older-than", "1d")
    assert not Job.objects.exists()
    assert not JobMap.objects.exists()
