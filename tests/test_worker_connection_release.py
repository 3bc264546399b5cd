"""Handler threads' connections: refused ones cost no attempt, idle ones are closed."""

from __future__ import annotations

import os
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.db import connection

import django_jobqueue as jobqueue
from django_jobqueue.models import Job
from tests.conftest import assert_clean_log, poll, wait_for_job
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
def limited_role() -> Iterator[str]:
    """A login role on the test database whose new connections the test can refuse."""
    name = f"jq_limited_{os.getpid()}"
    with connection.cursor() as cursor:
        cursor.execute(f'CREATE ROLE "{name}" LOGIN')
        cursor.execute(f'GRANT ALL ON ALL TABLES IN SCHEMA public TO "{name}"')
        cursor.execute(f'GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO "{name}"')
    try:
        yield name
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                [name],
            )
            cursor.execute(f'DROP OWNED BY "{name}"')
            cursor.execute(f'DROP ROLE "{name}"')


def role_sessions(role: str) -> list[str]:
    """The last statement of each session of `role` on the test database."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT query FROM pg_stat_activity WHERE usename = %s AND datname = "
            "current_database()",
            [role],
        )
        return [row[0] for row in cursor.fetchall()]


@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="needs a per-role connection limit that spares open sessions (PostgreSQL's "
    "CONNECTION LIMIT); MariaDB's per-account limits were not relied on",
)
def test_job_whose_thread_cannot_connect_is_handed_back_without_an_attempt(
    start_worker, limited_role
):
    url = urlsplit(os.environ["DATABASE_URL"])
    as_role = urlunsplit(url._replace(netloc=f"{limited_role}@{url.hostname}:{url.port}"))
    worker = start_worker("--concurrency", "2", env={"DATABASE_URL": as_role})
    worker.wait_registered()
    # The duties are connected (the dispatcher has claimed); the handler threads, lazily
    # connected, are not: no job has run.
    poll(lambda: any(q.startswith("WITH c (id) AS") for q in role_sessions(limited_role)))
    with connection.cursor() as cursor:
        cursor.execute(f'ALTER ROLE "{limited_role}" CONNECTION LIMIT 0')
    try:
        job = jobqueue.enqueue("conn.session")
        poll(lambda: "handed 1 job(s) back without charging an attempt" in worker.output())
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'ALTER ROLE "{limited_role}" CONNECTION LIMIT -1')
    done = wait_for_job(job.pk, *FINAL, timeout=120)
    assert done.state == "done", done.last_error
    assert done.attempts == 1  # the refused connections cost none
    assert done.errors == []
    assert worker.stop() == 0
    assert_clean_log(worker.output())
