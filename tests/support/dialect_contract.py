"""The shared part of the dialect contract (tests/dialects/contract/): the claim and finish
entry points each test runs through, the fixtures that choose them, and small helpers.

The fixtures are registered by tests/dialects/contract/conftest.py.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from django_jobqueue.dialects import get_dialect
from django_jobqueue.dialects.base import Dialect
from django_jobqueue.engine import leases
from django_jobqueue.models import Job, Worker

TTL = 30.0
DIALECT = get_dialect("default")


@pytest.fixture
def dialect() -> Dialect:
    return get_dialect("default")


def ready_jobs() -> Any:
    return Job.objects.using("default").ready()


def claim(dialect: Dialect, owner: str = "w1", limit: int = 10, **kwargs: Any) -> list[Any]:
    return leases.claim(dialect, owner=owner, queues=[], limit=limit, lease_ttl=TTL, **kwargs)


def claim_in_transaction(dialect: Dialect, owner: str = "w1", limit: int = 10) -> list[Any]:
    """The dialect's claim statement itself, inside the claim transaction."""
    return dialect.run_in_transaction(
        lambda: dialect.claim_ready(ready_jobs(), owner=owner, limit=limit, lease_ttl=TTL)
    )


CLAIMS = {"leases.claim": claim, "dialect.claim_ready": claim_in_transaction}


@pytest.fixture(params=sorted(CLAIMS))
def claim_by(request: pytest.FixtureRequest) -> Any:
    """Each way in: the worker's claim() (one autocommit statement where the dialect can), and
    the dialect's claim_ready() inside a transaction."""
    return CLAIMS[request.param]


def finish_in_transaction(
    dialect: Dialect, owner: str, items: list[tuple[int, int, str | None]]
) -> leases.FinishReport:
    return dialect.run_in_transaction(lambda: dialect.finish_many(owner=owner, items=items))


FINISHES = {"leases.finish_many": leases.finish_many, "dialect.finish_many": finish_in_transaction}


@pytest.fixture(params=sorted(FINISHES))
def finish_by(request: pytest.FixtureRequest) -> Any:
    """Each way in: the worker's finish_many() (finish_simple() first where the dialect has
    autocommit statements), and the dialect's finish_many() inside a transaction."""
    return FINISHES[request.param]


def row(job_id: int) -> dict[str, Any]:
    return Job.objects.filter(pk=job_id).values().get()


def expire(job_id: int, dialect: Dialect) -> None:
    Job.objects.filter(pk=job_id).update(lease_expires=dialect.now() - dt.timedelta(hours=1))


def register(dialect: Dialect, worker_id: str, *, alive: bool, job_ids: list[int]) -> None:
    now = dialect.now()
    Worker.objects.create(
        id=worker_id, host="h", pid=1, concurrency=1, started_at=now, heartbeat_at=now,
        lease_ttl=TTL, expires_at=now + dt.timedelta(seconds=TTL if alive else -TTL),
        job_ids=job_ids,
    )  # fmt: skip


def close_connections() -> None:
    from django.db import connections

    connections.close_all()
