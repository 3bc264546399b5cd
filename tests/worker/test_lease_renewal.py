"""Renewal and release of many leases: chunked, generation-fenced, each transaction bounded."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from django_jobqueue.dialects import get_dialect
from django_jobqueue.engine import leases
from django_jobqueue.models import Job
from django_jobqueue.worker.heartbeat import renew_leases
from tests.support.markers import not_sqlite

pytestmark = pytest.mark.django_db(transaction=True)

OWNER = "host:1:many"
HELD = 20_000


def hold(count: int, *, owner: str = OWNER, attempts: int = 1) -> list[leases.Lease]:
    """Insert `count` jobs running under leases of `owner` that expire in a minute."""
    expires = timezone.now() + dt.timedelta(minutes=1)
    rows = [
        Job(
            type="test.noop",
            args={},
            state=Job.State.RUNNING,
            attempts=attempts,
            max_attempts=attempts + 5,
            lease_owner=owner,
            lease_expires=expires,
            worker_ids=[owner],
        )
        for _ in range(count)
    ]
    Job.objects.bulk_create(rows, batch_size=500)
    ids = Job.objects.filter(lease_owner=owner, attempts=attempts).values_list("pk", flat=True)
    return [leases.Lease(pk, owner, attempts) for pk in ids]


def test_twenty_thousand_leases_are_renewed_in_bounded_transactions():
    """One OR term per lease failed on SQLite ("Expression tree is too large") and ran for
    minutes in one transaction on PostgreSQL; chunks of FENCE_CHUNK leases renew them all."""
    held = hold(HELD)
    assert len(held) == HELD
    dialect = counting(get_dialect("default"))
    renewed = renew_leases(dialect, held, lease_ttl=3600)
    assert renewed == HELD
    soon = timezone.now() + dt.timedelta(minutes=30)
    assert not Job.objects.filter(lease_owner=OWNER, lease_expires__lt=soon).exists()
    # One short transaction per chunk of leases, not one for them all.
    assert dialect.transactions == -(-HELD // leases.FENCE_CHUNK)


def counting(dialect):
    """`dialect`, counting the transactions it runs."""

    class Counting(type(dialect)):
        transactions = 0

        def run_in_transaction(self, func, *, tries=None):
            self.transactions += 1
            return super().run_in_transaction(func, tries=tries)

    return Counting(dialect.using)


def test_renewal_keeps_the_generation_fence_for_every_lease():
    """A lease of the same owner whose row has moved on to a new generation is not renewed."""
    current = hold(1200)
    stale = hold(300, attempts=3)
    # The stale leases' rows were reclaimed and claimed again by the same owner name.
    Job.objects.filter(pk__in=[lease.job_id for lease in stale]).update(attempts=4)
    before = dict(
        Job.objects.filter(pk__in=[lease.job_id for lease in stale]).values_list(
            "pk", "lease_expires"
        )
    )
    dialect = get_dialect("default")
    assert renew_leases(dialect, [*current, *stale], lease_ttl=3600) == len(current)
    after = dict(
        Job.objects.filter(pk__in=[lease.job_id for lease in stale]).values_list(
            "pk", "lease_expires"
        )
    )
    assert after == before
    soon = timezone.now() + dt.timedelta(minutes=30)
    renewed = Job.objects.filter(pk__in=[lease.job_id for lease in current])
    assert not renewed.filter(lease_expires__lt=soon).exists()


def test_many_leases_of_mixed_generations_are_released():
    """release() (shutdown) took one OR term per lease too."""
    first = hold(1500)
    second = hold(700, attempts=2)
    dialect = get_dialect("default")
    assert leases.release(dialect, [*first, *second]) == len(first) + len(second)
    assert Job.objects.filter(state=Job.State.READY).count() == len(first) + len(second)
    assert set(Job.objects.values_list("attempts", flat=True)) == {0, 1}


def test_fences_chunk_by_size_and_group():
    many = [leases.Lease(n, "w", 1 + n % 3) for n in range(1, 2001)]
    chunks = list(leases.fences(many, size=500))
    assert [count for _, count in chunks] == [500] * 4
    few = [leases.Lease(n, "w", n) for n in range(1, 101)]
    chunks = list(leases.fences(few, size=500))
    # One term per generation, at most FENCE_TERMS of them in one condition.
    assert [count for _, count in chunks] == [32, 32, 32, 4]
    assert list(leases.fences([])) == []


@not_sqlite("SQLite has no statement timeout (busy timeout only)")
def test_statement_timeout_ends_a_long_statement_and_leaves_the_session_as_it_was():
    dialect = get_dialect("default")
    sleep = "SELECT pg_sleep(5)" if connection.vendor == "postgresql" else "SELECT SLEEP(5)"
    setting = (
        "SHOW statement_timeout"
        if connection.vendor == "postgresql"
        else "SELECT @@SESSION.max_statement_time"
        if connection.mysql_is_mariadb
        else "SELECT @@SESSION.max_execution_time"
    )
    with connection.cursor() as cursor:
        cursor.execute(setting)
        prior = cursor.fetchone()[0]
    with (
        pytest.raises(DatabaseError),
        transaction.atomic(),
        dialect.statement_timeout(0.2),
        connection.cursor() as cursor,
    ):
        cursor.execute(sleep)
        # MySQL's SLEEP() returns 1 when interrupted instead of raising.
        if cursor.fetchone()[0] == 1:
            raise DatabaseError("interrupted")
    with connection.cursor() as cursor:
        cursor.execute(setting)
        assert cursor.fetchone()[0] == prior
