"""PostgreSQL: the configured isolation level, in each form Django takes, decides the claim path."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from django.db import connections, transaction

import django_jobqueue as jobqueue
from django_jobqueue.dialects import get_dialect
from django_jobqueue.engine import leases
from django_jobqueue.models import Job
from tests.support.extra_databases import second_connection
from tests.support.markers import only_postgresql

IsolationLevel = pytest.importorskip("django.db.backends.postgresql.psycopg_any").IsolationLevel

pytestmark = [
    pytest.mark.django_db(transaction=True),
    only_postgresql("PostgreSQL isolation levels"),
]


@pytest.fixture
def configured() -> Iterator[Callable[[Any], str]]:
    """Open second connections to the test database with OPTIONS["isolation_level"] set."""
    with ExitStack() as stack:

        def open_with(isolation_level: Any) -> str:
            alias = f"isolation_{len(stack._exit_callbacks)}"
            options = {"isolation_level": isolation_level}
            return stack.enter_context(second_connection(alias, options=options))

        yield open_with


def claim_statements(alias: str) -> list[tuple[str, bool]]:
    """Claim one ready job on `alias`; return each statement run, and whether in a transaction."""
    ran: list[tuple[str, bool]] = []
    conn = connections[alias]

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        ran.append((sql, not conn.get_autocommit()))
        return execute(sql, params, many, context)

    with conn.execute_wrapper(record):
        [claimed] = leases.claim(get_dialect(alias), owner="w1", queues=[], limit=1, lease_ttl=30)
    assert Job.objects.get(pk=claimed.id).state == Job.State.RUNNING
    return ran


def show_isolation(alias: str) -> str:
    with connections[alias].cursor() as cursor:
        cursor.execute("SHOW transaction_isolation")
        return str(cursor.fetchone()[0])


def test_read_committed_as_a_psycopg_enum_keeps_the_one_statement_claim(configured) -> None:
    alias = configured(IsolationLevel.READ_COMMITTED)
    jobqueue.enqueue("test.noop")
    assert get_dialect(alias).autocommit_statements
    ran = claim_statements(alias)
    [(_, in_transaction)] = [(sql, txn) for sql, txn in ran if "RETURNING" in sql]
    assert not in_transaction  # one UPDATE ... RETURNING in autocommit
    assert not any("ISOLATION LEVEL" in sql for sql, _ in ran)


def test_serializable_pins_read_committed_for_the_claim(configured) -> None:
    alias = configured(IsolationLevel.SERIALIZABLE)
    jobqueue.enqueue("test.noop")
    dialect = get_dialect(alias)
    assert not dialect.autocommit_statements
    with transaction.atomic(using=alias):  # the project's own transactions keep its level
        assert show_isolation(alias) == "serializable"
    assert dialect.run_in_transaction(lambda: show_isolation(alias)) == "read committed"
    ran = claim_statements(alias)
    pins = [n for n, (sql, _) in enumerate(ran) if "ISOLATION LEVEL READ COMMITTED" in sql]
    [claim] = [n for n, (sql, _) in enumerate(ran) if "RETURNING" in sql]
    assert pins and pins[0] < claim and ran[claim][1]  # pinned first, in the same transaction


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        (IsolationLevel.READ_COMMITTED, "READ COMMITTED"),
        (int(IsolationLevel.READ_COMMITTED), "READ COMMITTED"),  # what Django reads it as
        (IsolationLevel.REPEATABLE_READ, "REPEATABLE READ"),
        (IsolationLevel.SERIALIZABLE, "SERIALIZABLE"),
        ("read committed", "READ COMMITTED"),
        ("SERIALIZABLE", "SERIALIZABLE"),
        ("repeatable_read", "REPEATABLE READ"),
    ],
)
def test_each_form_of_the_level_reads_the_same(value: Any, expected: str | None) -> None:
    from django_jobqueue.dialects.postgresql import isolation_level

    assert isolation_level({"OPTIONS": {"isolation_level": value}}) == expected
