"""SQLite: enqueue() beside busy workers never fails with "database is locked"."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.db import connection
from django.test import override_settings

import django_jobqueue as jobqueue
from django_jobqueue.models import Job
from tests.conftest import ROOT, poll
from tests.support.extra_databases import sqlite_alias
from tests.support.markers import only_sqlite

pytestmark = [
    pytest.mark.django_db(transaction=True),
    only_sqlite("SQLite's database write lock"),
]


def test_plain_enqueue_waits_out_a_write_lock_held_past_the_busy_timeout():
    """The plain INSERT was not retried: it failed once the busy timeout ran out."""
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA busy_timeout = 100")
    holder = sqlite3.connect(
        connection.settings_dict["NAME"], isolation_level=None, check_same_thread=False
    )
    holder.execute("BEGIN IMMEDIATE")
    released = threading.Timer(1.0, holder.execute, ["COMMIT"])
    released.start()
    try:
        job = jobqueue.enqueue("test.noop")
    finally:
        released.join()
        holder.close()
    assert Job.objects.filter(pk=job.pk, state=Job.State.READY).exists()


def test_producer_processes_enqueue_beside_two_workers_without_a_failure(start_worker):
    """Several processes enqueue one by one while two workers drain: no enqueue fails."""
    producers, each = 4, 300
    workers = [start_worker("--concurrency", "2") for _ in range(2)]
    for worker in workers:
        worker.wait_registered()
    env = {
        **os.environ,
        "JOBQUEUE_TEST_SUBPROCESS": "1",
        "DJANGO_SETTINGS_MODULE": "tests.settings",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.enqueue_loop", str(each)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(producers)
    ]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
        reports.append(json.loads(out))
    failures = [f for r in reports for f in r["failures"]]
    assert failures == []
    total = producers * each
    poll(lambda: Job.objects.filter(state=Job.State.DONE).count() == total, timeout=300)
    latencies = sorted(x for r in reports for x in r["latencies"])
    p99 = latencies[int(len(latencies) * 0.99)]
    print(f"enqueue p99 {p99 * 1000:.0f} ms over {total} enqueues")  # shown with -s
    for worker in workers:
        assert worker.stop() == 0


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
