"""The maintainer duty: where autovacuum is off, the queue vacuums its own tables.

PostgreSQL leaves a dead row version behind every claim and finish until a VACUUM removes it;
these tests turn autovacuum off for the job table, as a server with `autovacuum = off` (or one
that lags behind) would have it, and make dead rows by the thousand.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest
from django.db import connection, connections

from django_jobqueue import conf
from django_jobqueue.dialects import get_dialect
from django_jobqueue.models import Job, JobDependency
from tests.conftest import in_new_thread, poll
from tests.support.markers import only_postgresql

pytestmark = pytest.mark.django_db(transaction=True)
TABLE = Job._meta.db_table
needs_postgres = only_postgresql("VACUUM and pg_stat_user_tables are PostgreSQL's")


@pytest.fixture
def no_autovacuum() -> Iterator[None]:
    """Autovacuum off for the job table, which starts vacuumed and analyzed, as does the
    dependency table (the maintainer watches both): the dead rows and changes that earlier
    tests of the lane left in their counters are gone."""
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {TABLE} SET (autovacuum_enabled = false)")
        cursor.execute(f"VACUUM ANALYZE {TABLE}")
        cursor.execute(f"VACUUM ANALYZE {JobDependency._meta.db_table}")
    table_stats()
    yield
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {TABLE} RESET (autovacuum_enabled)")


def table_stats() -> tuple[int, int]:
    """(dead tuples, vacuums so far) of the job table, with this backend's counts flushed."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
    with connection.cursor() as cursor:  # a new transaction sees the flushed counts
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT n_dead_tup, vacuum_count FROM pg_stat_user_tables WHERE relid = %s::regclass",
            [TABLE],
        )
        dead, vacuums = cursor.fetchone()
    return dead, vacuums


def make_dead_rows(count: int) -> None:
    """`count` new jobs, each updated once: `count` dead row versions."""
    # Of a handler no worker here has: they stay `ready`, never claimed.
    jobs = Job.objects.bulk_create(
        (Job(type="test.of_another_release") for _ in range(count)), batch_size=5000
    )
    Job.objects.filter(pk__in=[j.pk for j in jobs]).update(priority=1)


@needs_postgres
def test_maintain_vacuums_a_table_past_the_threshold_and_leaves_one_below(no_autovacuum):
    dialect = get_dialect("default")
    make_dead_rows(300)
    assert table_stats()[0] >= 300
    assert dialect.maintain(min_rows=1000, fraction=0.05) == []
    make_dead_rows(1000)
    dead, vacuums = table_stats()
    assert dead >= 1000
    assert dialect.maintain(min_rows=1000, fraction=0.05) == [
        f'VACUUM (ANALYZE, SKIP_LOCKED) "{TABLE}"'
    ]
    after, _ = poll(lambda: (s := table_stats())[1] > vacuums and s)
    assert after < dead


@needs_postgres
def test_maintain_analyzes_a_table_whose_statistics_are_stale(no_autovacuum):
    dialect = get_dialect("default")
    Job.objects.bulk_create((Job(type="test.noop") for _ in range(1500)), batch_size=5000)
    table_stats()  # flushed: 1,500 rows changed since the last ANALYZE, none dead
    assert dialect.maintain(min_rows=1000, fraction=0.05) == [f'ANALYZE (SKIP_LOCKED) "{TABLE}"']
    assert dialect.maintain(min_rows=1000, fraction=0.05) == []


@needs_postgres
def test_maintain_skips_a_table_being_vacuumed_instead_of_waiting(no_autovacuum):
    make_dead_rows(1000)
    table_stats()
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:  # what a VACUUM by another worker holds: SHARE UPDATE EXCLUSIVE
        with connections["default"].cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute(f"LOCK TABLE {TABLE} IN SHARE UPDATE EXCLUSIVE MODE")
            locked.set()
            release.wait(60)
            cursor.execute("ROLLBACK")
        connections["default"].close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(30)
        started = time.monotonic()
        assert get_dialect("default").maintain(min_rows=1000, fraction=0.05)
        assert time.monotonic() - started < 20  # a wait would last until the holder lets go
    finally:
        release.set()
        holder.join(60)


@needs_postgres
def test_a_worker_vacuums_the_job_table_when_autovacuum_is_off(no_autovacuum, start_worker):
    make_dead_rows(12_000)  # past the maintainer's MIN_ROWS
    _, vacuums = table_stats()
    worker = start_worker()
    worker.wait_registered()
    poll(lambda: f'Ran VACUUM (ANALYZE, SKIP_LOCKED) "{TABLE}"' in worker.output(), timeout=60)
    assert table_stats()[1] > vacuums
    assert worker.stop() == 0
    output = worker.output()
    (duties,) = [line for line in output.splitlines() if " duties: " in line]
    assert "maintainer" in duties


@needs_postgres
def test_maintenance_false_starts_no_maintainer(start_worker):
    worker = start_worker(env={"JOBQUEUE_TEST_MAINTENANCE": json.dumps(False)})
    worker.wait_registered()
    assert worker.stop() == 0
    (duties,) = [line for line in worker.output().splitlines() if " duties: " in line]
    assert "heartbeat" in duties and "maintainer" not in duties


def test_maintenance_setting_must_be_a_boolean():
    with pytest.raises(Exception, match="MAINTENANCE"):
        conf.load({"MAINTENANCE": "yes"})
    assert conf.load({"MAINTENANCE": False}).maintenance is False
    assert conf.load({}).maintenance is True


def test_only_postgresql_has_upkeep_to_do():
    dialect = get_dialect("default")
    assert dialect.maintains_tables == (connection.vendor == "postgresql")
    if connection.vendor != "postgresql":
        assert dialect.maintain(min_rows=1, fraction=0.0) == []


@needs_postgres
def test_every_connection_of_a_worker_names_its_worker_and_duty(start_worker):
    worker = start_worker()
    row = worker.wait_registered()

    def names() -> set[str]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT application_name FROM pg_stat_activity WHERE application_name LIKE %s",
                [f"jobqueue % {row.id}"],
            )
            return {name for (name,) in cursor.fetchall()}

    expected = {
        f"jobqueue {duty} {row.id}"
        for duty in ("dispatcher", "heartbeat", "housekeeper", "maintainer", "listener")
    }
    found = poll(lambda: (n := names()) >= expected and n)
    assert all(name.startswith("jobqueue ") for name in found)
    assert worker.stop() == 0


@needs_postgres
def test_a_process_of_one_role_names_every_connection_for_it():
    """The watchdog's process names its connection `jobqueue watchdog <worker id>`."""
    from django_jobqueue.worker import naming

    uninstall = naming.install("w-1", role="watchdog")
    try:

        def own_name() -> str:
            with connections["default"].cursor() as cursor:
                cursor.execute("SELECT current_setting('application_name')")
                return str(cursor.fetchone()[0])

        assert in_new_thread(own_name) == "jobqueue watchdog w-1"
    finally:
        uninstall()
    assert in_new_thread(own_name) != "jobqueue watchdog w-1"
