"""A worker whose database connections are cut by the server survives and keeps working."""

from __future__ import annotations

import pytest
from django.db import connection

import django_jobqueue as jobqueue
from django_jobqueue.models import Job
from tests.conftest import HANDED_BACK, WorkerProcess, poll, wait_for_job
from tests.support.connection_support import refusable_account
from tests.support.markers import not_sqlite, only_postgresql

pytestmark = [
    pytest.mark.django_db(transaction=True),
    not_sqlite("SQLite has no server to drop a connection"),
]


def other_sessions() -> list[int]:
    """Server-side ids of every other session on the test database: the worker's."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT pid FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        else:
            cursor.execute(
                "SELECT ID FROM information_schema.PROCESSLIST "
                "WHERE DB = DATABASE() AND ID <> CONNECTION_ID()"
            )
        return [row[0] for row in cursor.fetchall()]


def cut_other_sessions(expected: int) -> list[int]:
    """Terminate the other sessions once there are at least `expected` of them."""
    ids = poll(lambda: (found := other_sessions()) and len(found) >= expected and found)
    with connection.cursor() as cursor:
        for session in ids:
            if connection.vendor == "postgresql":
                cursor.execute("SELECT pg_terminate_backend(%s)", [session])
            else:
                try:
                    cursor.execute(f"KILL CONNECTION {int(session)}")
                except Exception as exc:  # it may have ended on its own meanwhile
                    if "Unknown thread id" not in str(exc):
                        raise
    return ids


def test_worker_survives_losing_its_connections_while_idle(start_worker):
    # Lease TTL 30s (the test settings): a job stuck on a dead connection would only come
    # back after its lease expired, so the bounds below would catch it.
    worker = start_worker("--concurrency", "1")
    worker.wait_registered()
    # Run a job first, so that the executor thread holds a connection too.
    first = jobqueue.enqueue("test.add", {"a": 1, "b": 1})
    assert wait_for_job(first.pk, Job.State.DONE, Job.State.DEAD).state == Job.State.DONE

    cut = cut_other_sessions(expected=2)  # the loop's and the executor thread's
    poll(lambda: not set(cut) & set(other_sessions()), timeout=30)

    after = jobqueue.enqueue("test.add", {"a": 2, "b": 3})
    done = wait_for_job(after.pk, Job.State.DONE, Job.State.DEAD, timeout=20)
    assert done.state == Job.State.DONE
    assert done.result == 5
    assert done.attempts == 1  # run on the first claim, not after a lease expiry
    assert worker.running()
    assert worker.stop() == 0
    assert "Lost the lease" not in worker.output()


def test_worker_survives_losing_its_connections_twice_under_load(start_worker):
    worker = start_worker("--concurrency", "2")
    worker.wait_registered()
    jobs = [jobqueue.enqueue("test.record", {"sleep": 0.05}) for _ in range(20)]
    for _ in range(2):
        cut_other_sessions(expected=1)
    for job in jobs:
        done = wait_for_job(job.pk, Job.State.DONE, Job.State.DEAD, timeout=90)
        assert done.state == Job.State.DONE, done.last_error
    assert worker.running()
    assert worker.stop() == 0


def start_failure(tmp_path, url: str) -> tuple[int, list[str]]:
    """Start a worker on `url`; return its exit status and the lines it printed."""
    worker = WorkerProcess([], tmp_path / "worker.log", env={"DATABASE_URL": url})
    try:
        code = worker.wait(timeout=120)
        return code, [line for line in worker.output().splitlines() if line.strip()]
    finally:
        worker.close()


@pytest.mark.parametrize(
    "url",
    ["postgres://postgres@127.0.0.1:1/jobqueue", "mysql://root@127.0.0.1:1/jobqueue"],
    ids=["postgresql", "mysql"],
)
def test_worker_that_cannot_connect_at_start_exits_with_one_line(tmp_path, url):
    """It used to exit with a traceback; now one line says why, and the exit is non-zero."""
    code, lines = start_failure(tmp_path, url)
    assert code != 0
    assert len(lines) == 1, lines
    assert lines[0].startswith("CommandError: Cannot connect to database 'default': ")
    assert "Traceback" not in lines[0]


def test_worker_whose_account_the_server_refuses_at_start_exits_with_one_line(tmp_path):
    """The server answers and turns the account away, as when no connection slot is left,
    rather than nothing listening on the port. PostgreSQL's refusal is a role's CONNECTION
    LIMIT 0, MariaDB's a user's MAX_USER_CONNECTIONS -1 (see `connection_support`)."""
    with refusable_account() as account:
        account.refuse()
        code, lines = start_failure(tmp_path, account.url)
    assert code == 1
    assert len(lines) == 1, lines
    assert lines[0].startswith("CommandError: Cannot connect to database 'default': ")
    assert account.name in lines[0]  # the server's refusal, which names the account


def kill_session(session: int) -> None:
    """End one server session (the handler thread's, whose id a job reported)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_terminate_backend(%s)", [session])
        else:
            cursor.execute(f"KILL CONNECTION {int(session)}")
    poll(lambda: session not in other_sessions(), timeout=30)


def test_job_whose_connection_was_cut_before_its_first_query_is_not_charged(start_worker, tmp_path):
    """The server ends the handler thread's connection while a job waits without touching
    the database; nothing else in the worker notices. The job's first query fails on it: the
    attempt is handed back uncharged and runs again on a new connection (issue 46)."""
    worker = start_worker("--concurrency", "1")
    worker.wait_registered()
    first = wait_for_job(jobqueue.enqueue("conn.session").pk, Job.State.DONE, Job.State.DEAD)
    marker = tmp_path / "go"
    job = jobqueue.enqueue("conn.after_file", {"path": str(marker), "query": True})
    poll(lambda: Job.objects.get(pk=job.pk).state == Job.State.RUNNING, timeout=30)
    kill_session(first.result)  # the thread's, opened before the job and kept through it
    marker.touch()
    done = wait_for_job(job.pk, Job.State.DONE, Job.State.DEAD, timeout=60)
    assert done.state == Job.State.DONE, done.last_error
    assert done.attempts == 1
    assert done.errors == []
    assert done.result != first.result  # a new session
    assert worker.output().count(HANDED_BACK) == 1, worker.output()[-3000:]
    assert worker.stop() == 0


def test_thread_checks_its_connection_before_a_job_after_the_worker_met_trouble(
    start_worker, tmp_path
):
    """Every connection of the worker is cut while a job waits without touching the database;
    the worker's duties meet the error. The thread's next job queries: its connection was
    checked before it (a ping, as the worker saw trouble), so it runs on a new one without
    failing, and without being handed back."""
    run_after_every_connection_is_cut(start_worker, tmp_path)


@only_postgresql("Django's connection pool is PostgreSQL's")
def test_pool_replaces_its_idle_connections_after_the_worker_met_trouble(start_worker, tmp_path):
    """The same with Django's connection pool: the thread holds no connection between jobs,
    and the pool's idle one is cut too. The first thread to see the trouble has the pool check
    its idle connections, so the next job borrows a live one and is not handed back."""
    run_after_every_connection_is_cut(
        start_worker,
        tmp_path,
        JOBQUEUE_TEST_DB_POOL='{"min_size": 1, "max_size": 2, "timeout": 60}',
    )


def run_after_every_connection_is_cut(start_worker, tmp_path, **env: str) -> None:
    """Cut the worker's connections while a job waits; the next job must run once, on a new
    connection, after no hand-back (the check before it did the work)."""
    worker = start_worker("--concurrency", "1", env=env)
    worker.wait_registered()
    first = wait_for_job(jobqueue.enqueue("conn.session").pk, Job.State.DONE, Job.State.DEAD)
    marker = tmp_path / "go"
    idle = jobqueue.enqueue("conn.after_file", {"path": str(marker)})
    poll(lambda: Job.objects.get(pk=idle.pk).state == Job.State.RUNNING, timeout=30)
    failed = worker.output().count("Worker duty ")
    cut_other_sessions(expected=3)  # the loop's, the heartbeat's, the thread's, ...
    poll(lambda: first.result not in other_sessions(), timeout=30)
    # A duty met it (the housekeeper's promoter runs every 50 ms): the worker knows of trouble.
    poll(lambda: worker.output().count("Worker duty ") > failed, timeout=30)
    after = jobqueue.enqueue("conn.session")
    marker.touch()
    done = wait_for_job(after.pk, Job.State.DONE, Job.State.DEAD, timeout=60)
    assert done.state == Job.State.DONE, done.last_error
    assert (done.attempts, done.errors) == (1, [])
    assert done.result != first.result
    assert wait_for_job(idle.pk, Job.State.DONE, Job.State.DEAD).state == Job.State.DONE
    assert HANDED_BACK not in worker.output()
    assert worker.stop() == 0
