"""The suite's skip markers, in one place: the Django versions and the database vendors a test
needs. Each reads what it gates on when the test module is imported (at collection), as a
`pytest.mark.skipif` written in the module would: the vendor of the test database's default
connection (`django.db.connection.vendor`: "postgresql", "mysql" for MySQL and MariaDB, or
"sqlite"), or what the default connection's dialect can do.

    @only_postgresql("LISTEN/NOTIFY is PostgreSQL's")
    def test_...

    pytestmark = [pytest.mark.django_db, not_sqlite("SQLite has no server to restart")]

The vendor markers take the reason that `-rs` shows for the skip: say what the test needs.
"""

from __future__ import annotations

import django
import pytest
from django.db import connection

from django_jobqueue.dialects import get_dialect

# django.tasks, the Tasks framework JobQueueBackend implements, is Django 6.0's.
requires_tasks = pytest.mark.skipif(django.VERSION < (6, 0), reason="django.tasks is Django 6.0+")


def requires_task_options(reason: str = "@task(**kwargs) is Django 6.1+") -> pytest.MarkDecorator:
    """Skip before Django 6.1, where @task(...) passes extra keyword arguments on to task_class
    (JobQueueTask's options)."""
    return pytest.mark.skipif(django.VERSION < (6, 1), reason=reason)


def only_postgresql(reason: str) -> pytest.MarkDecorator:
    """Run on PostgreSQL only."""
    return pytest.mark.skipif(connection.vendor != "postgresql", reason=reason)


def only_mysql(reason: str) -> pytest.MarkDecorator:
    """Run on MySQL and MariaDB only (Django's vendor "mysql" is both)."""
    return pytest.mark.skipif(connection.vendor != "mysql", reason=reason)


def only_sqlite(reason: str) -> pytest.MarkDecorator:
    """Run on SQLite only."""
    return pytest.mark.skipif(connection.vendor != "sqlite", reason=reason)


def not_sqlite(reason: str) -> pytest.MarkDecorator:
    """Run on the database servers (PostgreSQL, MySQL, MariaDB), not on SQLite."""
    return pytest.mark.skipif(connection.vendor == "sqlite", reason=reason)


def needs_skip_locked(reason: str) -> pytest.MarkDecorator:
    """Run where the dialect claims with SELECT ... FOR UPDATE SKIP LOCKED (row locks that others
    skip): every vendor but SQLite, whose writers take turns on the whole database."""
    return pytest.mark.skipif(
        not get_dialect("default").has_select_for_update_skip_locked, reason=reason
    )


def needs_listen_notify(reason: str) -> pytest.MarkDecorator:
    """Run where the dialect wakes workers by LISTEN/NOTIFY (PostgreSQL)."""
    return pytest.mark.skipif(not get_dialect("default").supports_listen_notify, reason=reason)
