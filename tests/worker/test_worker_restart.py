"""A handler thread's connection after a database server restart (PostgreSQL, MariaDB/MySQL):
the thread's next job is charged nothing for the connection the restart closed (issue 46).

Each test restarts the server (`tests/support/restart_support.py` says with which commands) while a
job waits without touching the database, on a worker with one handler thread.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

import django_jobqueue as jobqueue
from django_jobqueue.models import Job
from tests.conftest import HANDED_BACK, poll, wait_for_job
from tests.support.markers import not_sqlite
from tests.support.restart_support import restart, restart_commands, wait_until_ready

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.server_restart,
    not_sqlite("SQLite has no server to restart"),
]


def restart_while_a_job_waits(start_worker, tmp_path, *, query: bool) -> tuple[Any, Job, Job]:
    """Start a worker of one thread, run a job that connects, then a job that waits for a
    file without touching the database; restart the server meanwhile, and let the job go on
    (querying first if `query`). Return the worker, the first job (done) and the waiting one."""
    stop, start = restart_commands()
    wait_until_ready()
    worker = start_worker("--concurrency", "1")
    worker.wait_registered()
    first = wait_for_job(jobqueue.enqueue("conn.session").pk, Job.State.DONE, Job.State.DEAD)
    marker = tmp_path / "restarted"
    waiting = jobqueue.enqueue("conn.after_file", {"path": str(marker), "query": query})
    try:
        poll(lambda: Job.objects.get(pk=waiting.pk).state == Job.State.RUNNING, timeout=30)
        time.sleep(0.5)  # the handler is inside its wait (nothing else is queued)
        restart(stop, start, down_for=1.0)
    finally:
        wait_until_ready()
        marker.touch()
    return worker, first, waiting


def test_job_after_a_restart_on_a_thread_busy_through_it_is_not_charged(start_worker, tmp_path):
    """Job X waits through the restart; job Y, enqueued once the server is back, runs next on
    the same thread and queries: the thread checked its connection first (the worker met the
    restart elsewhere), so Y runs once, on a new connection, and nothing is handed back."""
    worker, first, _ = restart_while_a_job_waits(start_worker, tmp_path, query=False)
    after = jobqueue.enqueue("conn.session")
    done = wait_for_job(after.pk, Job.State.DONE, Job.State.DEAD, timeout=90)
    assert done.state == Job.State.DONE, done.last_error
    assert (done.attempts, done.errors) == (1, [])
    assert done.result != first.result  # a new session
    assert HANDED_BACK not in worker.output()
    assert worker.stop() == 0


def test_job_whose_first_query_meets_the_connection_the_restart_closed_is_not_charged(
    start_worker, tmp_path
):
    """The waiting job itself queries after the restart, on the connection its thread held
    through it: the attempt is handed back uncharged, and runs again on a new connection."""
    worker, first, waiting = restart_while_a_job_waits(start_worker, tmp_path, query=True)
    done = wait_for_job(waiting.pk, Job.State.DONE, Job.State.DEAD, timeout=90)
    assert done.state == Job.State.DONE, done.last_error
    assert (done.attempts, done.errors) == (1, [])
    assert done.result != first.result
    assert worker.output().count(HANDED_BACK) == 1, worker.output()[-3000:]
    assert worker.stop() == 0
