"""SQLite: four worker processes and a producer process write at once; no "database is
locked" escapes, and every job produced is done."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from django_jobqueue.models import Job
from tests.chaos.producer import expected_jobs
from tests.chaos.support import check_log, env_int, unfinished
from tests.conftest import ROOT, poll
from tests.support.markers import only_sqlite
from tests.testapp.models import Order, RunRecord

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.chaos,
    pytest.mark.slow,
    only_sqlite("one writer at a time: SQLite only"),
]


def test_workers_and_a_producer_writing_at_once_never_see_database_is_locked(
    start_worker, tmp_path, chaos_report
):
    workers = [start_worker("--concurrency", "2") for _ in range(4)]
    for worker in workers:
        worker.wait_registered()
    out, errors = tmp_path / "produced.txt", tmp_path / "producer.log"
    rounds = env_int("JOBQUEUE_CHAOS_ROUNDS", 300)
    started = time.monotonic()
    with errors.open("w") as log:
        producer = subprocess.Popen(
            [sys.executable, "-m", "tests.chaos.producer", str(out), str(rounds)],
            cwd=ROOT,
            env={
                **os.environ,
                "JOBQUEUE_TEST_SUBPROCESS": "1",
                "DJANGO_SETTINGS_MODULE": "tests.settings",
            },
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        status = producer.wait(300)
    produced_text = errors.read_text()
    assert status == 0, produced_text[-4000:]
    assert "database is locked" not in produced_text
    ids = [int(pk) for line in out.read_text().splitlines() for pk in line.split()]
    assert len(ids) == expected_jobs(rounds)
    poll(lambda: unfinished(ids) == 0, timeout=300, interval=0.5)
    elapsed = time.monotonic() - started
    assert all(worker.running() for worker in workers)
    assert [worker.stop() for worker in workers] == [0] * 4

    skipped_beats = 0
    for worker in workers:
        skipped_beats += check_log(worker)
    # Every job produced committed, ran once and is done (containers included).
    assert Job.objects.filter(pk__in=ids).count() == len(ids)
    assert Job.objects.filter(pk__in=ids).exclude(state=Job.State.DONE).count() == 0
    assert Job.objects.filter(pk__in=ids, attempts__gt=1).count() == 0
    ran = Job.objects.filter(pk__in=ids, is_container=False).count()
    assert RunRecord.objects.filter(job_id__in=ids).count() == ran
    assert Order.objects.count() == len(range(0, rounds, 3))
    claimed = sum(int(w.output().rsplit("(claimed ", 1)[1].split()[0]) for w in workers)
    chaos_report(
        "sqlite-writers",
        jobs=len(ids),
        workers=len(workers),
        producer_rounds=rounds,
        claimed=claimed,
        database_is_locked=0,
        skipped_beats=skipped_beats,
        lost=0,
        seconds=round(elapsed),
    )
