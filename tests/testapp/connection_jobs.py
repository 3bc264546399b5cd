"""Handlers for the tests of handler threads' connections (imported by jobs.py to register them)."""

from __future__ import annotations

import time

from django.db import connection

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
