"""Handlers for the tests of handler threads' connections (imported by jobs.py to register them)."""

from __future__ import annotations

import os
import time

from django.db import connection, transaction

import django_jobqueue as jobqueue


@jobqueue.handler("conn.session")
def session(sleep: float = 0.0) -> int:
    """Return the server's id of this thread's database session (a query, so it connects)."""
    if sleep:
        time.sleep(sleep)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_backend_pid()")
        elif connection.vendor == "mysql":
            cursor.execute("SELECT CONNECTION_ID()")
        else:
            cursor.execute("SELECT 0")
        return int(cursor.fetchone()[0])


@jobqueue.handler("conn.pooled")
def pooled(sleep: float = 0.0) -> dict[str, bool]:
    """What a handler sees of its pooled connection after a query, and in a transaction."""
    from django_jobqueue.models import Job

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    after_cursor = connection.connection is None
    Job.objects.filter(pk=-1).exists()
    after_orm_query = connection.connection is None
    time.sleep(sleep)
    with transaction.atomic():
        Job.objects.filter(pk=-1).exists()
        held_in_transaction = connection.connection is not None
        Job.objects.filter(pk=-1).exists()
    return {
        "given_back_after_cursor": after_cursor,
        "given_back_after_orm_query": after_orm_query,
        "held_in_transaction": held_in_transaction,
    }


@jobqueue.handler("conn.after_file")
def after_file(path: str, query: bool = False) -> int | None:
    """Wait until the file `path` exists, without touching the database (a test cuts or
    restarts the server meanwhile); then, with `query`, return this thread's session id
    from the job's first query."""
    deadline = time.monotonic() + 120
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.05)
    return session() if query else None
