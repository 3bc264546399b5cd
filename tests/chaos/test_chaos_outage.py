"""A handler whose query cannot connect (its server is away) fails that attempt only: the
worker's thread survives, and the job is retried (found by the MariaDB restart run)."""

from __future__ import annotations

import pytest
from django.db import connection

import django_jobqueue as jobqueue
from django_jobqueue.models import Job
from tests.chaos.support import check_log
from tests.conftest import poll, wait_for_job
from tests.support.markers import only_postgresql

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.chaos, pytest.mark.slow]


def test_handler_that_cannot_connect_fails_its_attempt_and_its_thread_lives_on(start_worker):
    worker = start_worker("--concurrency", "1", env={"PYTHONFAULTHANDLER": "1"})
    job = jobqueue.enqueue("chaos.cannot_connect_once", max_attempts=3)
    after = jobqueue.enqueue("test.add", {"a": 2, "b": 3})
    done = wait_for_job(job.pk, Job.State.DONE, Job.State.DEAD, timeout=30)
    assert done.state == Job.State.DONE
    assert done.result == 2
    assert [e["type"] for e in done.errors] == ["django.db.utils.OperationalError"]
    assert wait_for_job(after.pk, Job.State.DONE, Job.State.DEAD, timeout=30).result == 5
    assert "Exception in thread" not in worker.output()
    assert worker.stop() == 0
    check_log(worker)


@only_postgresql("LISTEN/NOTIFY: PostgreSQL only")
def test_listener_that_loses_its_connection_reconnects_without_a_traceback(start_worker):
    """A server restart cuts the wake-up listener's connection: a database error like any
    other duty's, logged in one line (found by the PostgreSQL restart run)."""
    worker = start_worker("--concurrency", "1")
    worker.wait_registered()

    def listener_sessions() -> list[int]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND query LIKE 'LISTEN%%' AND pid <> pg_backend_pid()"
            )
            return [row[0] for row in cursor.fetchall()]

    (session,) = poll(listener_sessions, timeout=30)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [session])
    poll(lambda: "Worker duty listener failed" in worker.output(), timeout=30)
    poll(lambda: listener_sessions(), timeout=30)  # it listens again
    job = jobqueue.enqueue("test.add", {"a": 1, "b": 1})
    assert wait_for_job(job.pk, Job.State.DONE, Job.State.DEAD, timeout=30).result == 2
    assert worker.stop() == 0
    assert "Traceback" not in worker.output(), worker.output()[-3000:]
