"""Handler threads' connections: refused ones cost no attempt, idle ones are closed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection

import django_jobqueue as jobqueue
from django_jobqueue.models import Job
from tests.conftest import WorkerProcess, assert_clean_log, poll, wait_for_job
from tests.support.connection_support import Account, refusable_account
from tests.support.markers import not_sqlite, only_mysql, only_postgresql
from tests.worker.test_worker_connection import other_sessions

pytestmark = [
    pytest.mark.django_db(transaction=True),
    not_sqlite("SQLite has no server connections to refuse or hold"),
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


def test_a_workers_duties_hold_a_fixed_number_of_connections(account, start_worker):
    """Whatever its concurrency and duties, an idle worker holds the connections of its
    dispatcher, heartbeat, completer and housekeeper (promoter, reclaimer, recorder, scheduler,
    closer, pruner on one), and on PostgreSQL its listener's and maintainer's: 6, or 4 on
    MariaDB.
    Before the housekeeper, each of those five duties held one of its own (9 or 7 here)."""
    expected = 6 if connection.vendor == "postgresql" else 4
    worker = start_worker(
        "--concurrency", "16",
        env={
            "DATABASE_URL": account.url,
            "JOBQUEUE_TEST_RETENTION": '{"done": "1h"}',
            "JOBQUEUE_TEST_OPEN_CONTAINER_TIMEOUT": "3600",
        },
    )  # fmt: skip
    worker.wait_registered()
    jobs = jobqueue.enqueue_many([("conn.session", {"sleep": 0.05}) for _ in range(48)])
    for job in jobs:
        assert wait_for_job(job.pk, *FINAL, timeout=120).state == "done"
    (duties,) = [line for line in worker.output().splitlines() if " duties: " in line]
    assert "housekeeper (promoter, reclaimer, recorder, scheduler, closer, pruner)" in duties
    # The handler threads close theirs once idle (executor.IDLE_CLOSE); the duties keep theirs.
    poll(lambda: len(account.sessions()) == expected, timeout=60)
    assert worker.stop() == 0
    assert_clean_log(worker.output())


POOLED = {"JOBQUEUE_TEST_DB_POOL": '{"min_size": 1, "max_size": 2, "timeout": 60}'}


def drain_pooled(
    start_worker, account: Account, key: str, count: int, **env: str
) -> tuple[list[Job], int]:
    """Run `count` jobs of `key` (each sleeps 0.1 s) on a worker at --concurrency 8 whose
    database alias has a pool of 2; return them, done, and the most sessions it held."""
    worker = start_worker("--concurrency", "8", env={"DATABASE_URL": account.url, **POOLED, **env})
    worker.wait_registered()
    ids = [job.pk for job in jobqueue.enqueue_many([(key, {"sleep": 0.1})] * count)]
    peak = 0

    def finished() -> bool:
        nonlocal peak
        peak = max(peak, len(account.sessions()))
        return not Job.objects.filter(pk__in=ids).exclude(state__in=FINAL).exists()

    poll(finished, timeout=120)
    done = list(Job.objects.filter(pk__in=ids))
    assert {job.state for job in done} == {"done"}, [job.last_error for job in done]
    assert worker.stop() == 0
    assert_clean_log(worker.output())
    return done, peak


@only_postgresql("Django's connection pool is PostgreSQL's")
def test_handler_threads_borrow_from_the_pool_and_give_back(account, start_worker):
    """With OPTIONS["pool"] at max_size 2, a worker at --concurrency 8 runs its handlers on the
    pool's 2 connections, borrowed for a job and given back after it, and its duties on 6
    connections of their own beside the pool: never more than 8 in all. Before, each handler
    thread kept a pooled connection, and the duties took theirs from the pool as well: the pool
    ran dry and the worker stalled."""
    done, peak = drain_pooled(start_worker, account, "conn.session", 64)
    assert len({job.result for job in done}) <= 2  # the pool's connections, no other
    assert peak <= 6 + 2


@only_postgresql("Django's connection pool is PostgreSQL's")
@pytest.mark.parametrize("pool_return", ["job", "query"])
def test_pool_return_says_when_a_handler_gives_its_pooled_connection_back(
    pool_return, account, start_worker
):
    """POOL_RETURN = "query": a handler's pooled connection goes back each time its last
    cursor closes outside a transaction (a transaction keeps it), so 8 threads whose jobs
    query, then wait, share 2 connections a query at a time. "job" (the default) keeps it to
    the end of the job."""
    done, peak = drain_pooled(
        start_worker, account, "conn.pooled", 24, JOBQUEUE_TEST_POOL_RETURN=f'"{pool_return}"'
    )
    by_query = pool_return == "query"
    assert {
        (
            job.result["given_back_after_cursor"],
            job.result["given_back_after_orm_query"],
            job.result["held_in_transaction"],
        )
        for job in done
    } == {(by_query, by_query, True)}
    assert peak <= 6 + 2


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


@only_postgresql(
    "needs each idle session's last statement (pg_stat_activity); MariaDB's own version follows"
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


@only_mysql("MariaDB's version of the test above")
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
