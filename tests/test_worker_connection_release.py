"""Handler threads' connections: refused ones cost no attempt, idle ones are closed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection

import django_jobqueue as jobqueue
from django_jobqueue.models import Job
from tests.conftest import WorkerProcess, assert_clean_log, poll, wait_for_job
from tests.connection_support import Account, refusable_account
from tests.test_worker_connection import other_sessions

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor == "sqlite", reason="SQLite has no server connections to refuse or hold"
    ),
]

FINAL = Job.TERMINAL_STATES


def test_idle_worker_closes_its_handler_threads_connections(start_worker):
    """After a burst at --concurrency 8, the handler threads hold no session once idle."""
    worker = start_worker("--concurrency", "8")
    worker.wait_registered()
    jobs = jobqueue.enqueue_many([("conn.session", {"sleep": 0.05}) for _ in range(80)])
    sessions = set()
    for job in jobs:
        done = wait_for_job(job.pk, *FINAL, timeout=120)
        assert done.state == "done", done.last_error
        sessions.add(done.result)
    assert len(sessions) >= 2  # several threads ran jobs, each on its own session
    # Before the fix the threads kept their sessions for as long as the worker ran.
    poll(lambda: not sessions & set(other_sessions()), timeout=60)
    # A thread that closed its connection connects again for the next job.
    again = jobqueue.enqueue("conn.session")
    assert wait_for_job(again.pk, *FINAL).state == "done"
    assert worker.stop() == 0
    assert_clean_log(worker.output())


@pytest.fixture
def account() -> Iterator[Account]:
    """An account the server can be made to refuse; ask for it before `start_worker`, so that
    the workers are gone before it is dropped."""
    with refusable_account() as account:
        yield account


def last_statements(account: Account) -> list[str]:
    """The last statement of each PostgreSQL session of `account`."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT query FROM pg_stat_activity WHERE usename = %s AND datname = "
            "current_database()",
            [account.name],
        )
        return [row[0] for row in cursor.fetchall()]


def handed_back(worker: WorkerProcess, account: Account) -> Job:
    """Enqueue a job while `account` is refused; return it once the worker handed it back."""
    account.refuse()
    try:
        job = jobqueue.enqueue("conn.session")
        poll(lambda: "handed 1 job(s) back without charging an attempt" in worker.output())
    finally:
        account.allow()
    return job


@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="needs each idle session's last statement (pg_stat_activity); MariaDB's own "
    "version follows",
)
def test_job_whose_thread_cannot_connect_is_handed_back_without_an_attempt(account, start_worker):
    worker = start_worker("--concurrency", "2", env={"DATABASE_URL": account.url})
    worker.wait_registered()
    # The duties are connected (the dispatcher has claimed); the handler threads, lazily
    # connected, are not: no job has run.
    poll(lambda: any(q.startswith("WITH c (id) AS") for q in last_statements(account)))
    job = handed_back(worker, account)
    done = wait_for_job(job.pk, *FINAL, timeout=120)
    assert done.state == "done", done.last_error
    assert done.attempts == 1  # the refused connections cost none
    assert done.errors == []
    assert worker.stop() == 0
    assert_clean_log(worker.output())


@pytest.mark.skipif(connection.vendor != "mysql", reason="MariaDB's version of the test above")
def test_job_whose_thread_cannot_connect_is_handed_back_without_an_attempt_on_mariadb(
    account, start_worker
):
    """As on PostgreSQL, with two differences. The account is refused by MAX_USER_CONNECTIONS
    -1 (see `connection_support`). And MariaDB shows no idle session's last statement, so the
    sign that the duties are connected is a first job run to the end; the thread that ran it
    closes its connection once idle (executor.IDLE_CLOSE) before the server refuses, so the
    next job's thread must connect, whichever thread it is."""
    worker = start_worker("--concurrency", "2", env={"DATABASE_URL": account.url})
    worker.wait_registered()
    first = wait_for_job(jobqueue.enqueue("conn.session").pk, *FINAL, timeout=120)
    assert first.state == "done", first.last_error
    poll(lambda: first.result not in account.sessions(), timeout=120)
    job = handed_back(worker, account)
    done = wait_for_job(job.pk, *FINAL, timeout=120)
    assert done.state == "done", done.last_error
    assert done.attempts == 1  # the refused connections cost none
    assert done.errors == []
    assert worker.stop() == 0
    assert_clean_log(worker.output())
