"""The database itself rejects malformed rows: CHECK and UNIQUE constraints on every database.

Rows are written with plain ORM saves and updates, which skip model validation, so what is
tested is the constraint in the schema (MariaDB 10.2+ and MySQL 8.0.16+ enforce CHECK). Each
violation runs in its own atomic block, so the test's transaction survives it.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from django_jobqueue.models import Job, JobDependency, Worker
from tests.support.factories import JobDependencyFactory, JobFactory

pytestmark = pytest.mark.django_db

# A fixed instant for the constraint tests, which only ask whether a column is set. A test
# about expiry computes its times itself: this module is imported long before its tests run.
NOW = timezone.now()
LEASE = {"lease_owner": "worker-1", "lease_expires": NOW + dt.timedelta(seconds=30)}

# Field values that break a constraint, each with the constraint it breaks.
MALFORMED: list[tuple[str, dict[str, Any]]] = [
    ("leased-without-owner", {"state": "leased", "lease_expires": NOW}),
    ("leased-without-expiry", {"state": "leased", "lease_owner": "worker-1"}),
    ("running-without-lease", {"state": "running"}),
    ("ready-with-an-owner", {"state": "ready", "lease_owner": "worker-1"}),
    ("ready-with-an-expiry", {"state": "ready", "lease_expires": NOW}),
    ("waiting-with-a-lease", {"state": "waiting", **LEASE}),
    ("done-with-a-lease", {"state": "done", "finished_at": NOW, **LEASE}),
    ("done-without-finished-at", {"state": "done"}),
    ("dead-without-finished-at", {"state": "dead"}),
    ("cancelled-without-finished-at", {"state": "cancelled"}),
    ("ready-with-finished-at", {"state": "ready", "finished_at": NOW}),
    ("running-with-finished-at", {"state": "running", "finished_at": NOW, **LEASE}),
    ("unknown-state", {"state": "paused"}),
    ("empty-state", {"state": ""}),
    ("negative-attempts", {"attempts": -1}),
    ("zero-max-attempts", {"max_attempts": 0}),
    ("negative-max-attempts", {"max_attempts": -2}),
    ("zero-weight", {"weight": 0}),
    ("negative-weight", {"weight": -1}),
    ("zero-timeout", {"timeout": 0.0}),
    ("negative-timeout", {"timeout": -1.5}),
]

WELL_FORMED: list[tuple[str, dict[str, Any]]] = [
    ("waiting", {"state": "waiting"}),
    ("ready", {"state": "ready"}),
    ("leased", {"state": "leased", **LEASE}),
    ("running", {"state": "running", "attempts": 1, **LEASE}),
    ("done", {"state": "done", "finished_at": NOW, "result": {"ok": True}}),
    ("dead", {"state": "dead", "finished_at": NOW, "attempts": 3}),
    ("cancelled", {"state": "cancelled", "finished_at": NOW}),
    ("limits", {"attempts": 0, "max_attempts": 1, "weight": 1, "timeout": 0.001}),
]


def job_fields(**overrides: Any) -> dict[str, Any]:
    return {"type": "test.noop", "args": {}, "state": "ready", **overrides}


@pytest.mark.parametrize("fields", [f for _, f in MALFORMED], ids=[n for n, _ in MALFORMED])
def test_database_rejects_a_malformed_insert(fields: dict[str, Any]) -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.create(**job_fields(**fields))
    assert not Job.objects.exists()


@pytest.mark.parametrize("fields", [f for _, f in MALFORMED], ids=[n for n, _ in MALFORMED])
def test_database_rejects_a_malformed_update(fields: dict[str, Any]) -> None:
    job = JobFactory()
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.filter(pk=job.pk).update(**fields)
    job.refresh_from_db()
    assert (job.state, job.lease_owner, job.finished_at) == ("ready", None, None)


def test_database_rejects_malformed_bulk_create() -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.bulk_create(
            [Job(**job_fields()), Job(**job_fields(state="leased")), Job(**job_fields())]
        )
    assert not Job.objects.exists()


@pytest.mark.parametrize("fields", [f for _, f in WELL_FORMED], ids=[n for n, _ in WELL_FORMED])
def test_database_accepts_well_formed_rows(fields: dict[str, Any]) -> None:
    job = Job.objects.create(**job_fields(**fields))
    assert Job.objects.get(pk=job.pk).state == fields.get("state", "ready")


def test_lease_transition_in_one_update_is_allowed() -> None:
    """A claim sets state and lease together, and a finish clears them together."""
    job = JobFactory()
    Job.objects.filter(pk=job.pk).update(state="leased", **LEASE)
    Job.objects.filter(pk=job.pk).update(
        state="done", lease_owner=None, lease_expires=None, finished_at=NOW
    )
    assert Job.objects.get(pk=job.pk).state == "done"


def test_job_cannot_depend_on_itself() -> None:
    job = JobFactory()
    with pytest.raises(IntegrityError), transaction.atomic():
        JobDependency.objects.create(job=job, depends_on=job)
    assert not JobDependency.objects.exists()


def test_dependency_is_unique_per_pair() -> None:
    a, b = JobFactory(), JobFactory()
    JobDependency.objects.create(job=b, depends_on=a)
    with pytest.raises(IntegrityError), transaction.atomic():
        JobDependency.objects.create(job=b, depends_on=a)
    JobDependency.objects.create(job=a, depends_on=b)  # the reverse edge is another pair
    assert JobDependency.objects.count() == 2


def test_dependency_rows_need_existing_jobs() -> None:
    job = JobFactory()
    missing = job.pk + 1000
    with pytest.raises(IntegrityError), transaction.atomic():
        JobDependency.objects.create(job=job, depends_on_id=missing)
        connection.check_constraints()  # SQLite checks deferred foreign keys at commit
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.create(**job_fields(parent_id=missing))
        connection.check_constraints()


def test_deleting_a_job_deletes_its_edges_and_children() -> None:
    edge = JobDependencyFactory()
    container = JobFactory(state="waiting", is_container=True)
    child = JobFactory(parent=container)
    edge.depends_on.delete()
    assert not JobDependency.objects.exists()
    container.delete()
    assert not Job.objects.filter(pk=child.pk).exists()


def test_migrations_match_the_models() -> None:
    call_command("makemigrations", "django_jobqueue", check=True, dry_run=True, verbosity=0)


# --- querysets -------------------------------------------------------------------------------


def test_ready_honours_run_after_by_the_database_clock() -> None:
    now_job = JobFactory()
    past = JobFactory(run_after=timezone.now() - dt.timedelta(seconds=5))
    future = JobFactory(run_after=timezone.now() + dt.timedelta(minutes=5))
    waiting = JobFactory(state="waiting")
    ready = set(Job.objects.ready().values_list("pk", flat=True))
    assert ready == {now_job.pk, past.pk}
    assert future.pk not in ready and waiting.pk not in ready


def test_in_flight_expired_and_terminal() -> None:
    live = JobFactory(
        state="running", lease_owner="w", lease_expires=timezone.now() + dt.timedelta(hours=1)
    )
    stale = JobFactory(
        state="leased", lease_owner="w", lease_expires=timezone.now() - dt.timedelta(seconds=1)
    )
    done = JobFactory(state="done", finished_at=NOW)
    dead = JobFactory(state="dead", finished_at=NOW)
    JobFactory()
    assert set(Job.objects.in_flight().values_list("pk", flat=True)) == {live.pk, stale.pk}
    assert list(Job.objects.expired().values_list("pk", flat=True)) == [stale.pk]
    assert set(Job.objects.terminal().values_list("pk", flat=True)) == {done.pk, dead.pk}


def test_in_queues() -> None:
    a = JobFactory(queue="a")
    b = JobFactory(queue="b")
    assert list(Job.objects.in_queues(["a"]).values_list("pk", flat=True)) == [a.pk]
    assert Job.objects.in_queues(None).count() == Job.objects.in_queues([]).count() == 2
    assert set(Job.objects.in_queues(("a", "b")).values_list("pk", flat=True)) == {a.pk, b.pk}


def test_job_helpers() -> None:
    job = JobFactory(timeout=2.5)
    assert str(job) == f"test.noop #{job.pk} (ready)"
    assert not job.is_terminal
    assert job.timeout_delta == dt.timedelta(seconds=2.5)
    assert JobFactory().timeout_delta is None
    assert JobFactory(state="cancelled", finished_at=NOW).is_terminal
    edge = JobDependencyFactory()
    assert str(edge) == f"{edge.job_id} -> {edge.depends_on_id}"
    worker = Worker.objects.create(
        id="host:1:abc", host="host", pid=1, concurrency=2, started_at=NOW, heartbeat_at=NOW
    )
    assert str(worker) == "host:1:abc"
    assert Worker.objects.get(pk=worker.pk).queues == []


def test_json_columns_round_trip() -> None:
    value = {"n": [1, 2.5, None, True], "s": "é ✓ \U0001f600", "o": {"k": {}}}
    job = JobFactory(args=value, result=value, last_error={"type": "X", "message": "m"})
    job.refresh_from_db()
    assert job.args == value and job.result == value
    assert job.last_error == {"type": "X", "message": "m"}
    assert Job.objects.filter(args__o__k={}).get() == job
