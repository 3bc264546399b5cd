"""Keys compare exactly on every database: case, accents and trailing spaces count.

MySQL and MariaDB compare text by the column's collation, and their defaults (`*_ci`, the
test database's `utf8mb4_unicode_ci` included) ignore all three: the key columns carry a
binary no-pad collation there (migration 0008). PostgreSQL and SQLite compare exactly anyway.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from django_jobqueue import enqueue, inbox, pausing
from django_jobqueue.dialects import get_dialect
from django_jobqueue.engine import leases
from django_jobqueue.models import Effect, Job, Limit, ScheduleDefinition, ScheduleState, Worker

pytestmark = pytest.mark.django_db(transaction=True)

# Each differs from "résumé-1" only where a *_ci or PAD SPACE collation looks away.
LOOSE_TWINS = ["resume-1", "RÉSUMÉ-1", "Résumé-1", "résumé-1 "]


def claim(queues: list[str]) -> list[int]:
    claimed = leases.claim(
        get_dialect("default"), owner="collation-worker", queues=queues, limit=10, lease_ttl=30
    )
    return sorted(job.id for job in claimed)


def test_unique_key_matches_only_the_same_key():
    first = enqueue("test.noop", {"n": 0}, unique_key="résumé-1")
    assert enqueue("test.noop", {"n": 1}, unique_key="résumé-1").pk == first.pk
    twins = [enqueue("test.noop", {"n": i}, unique_key=key) for i, key in enumerate(LOOSE_TWINS)]
    assert first.pk not in {job.pk for job in twins}
    assert len({job.pk for job in twins}) == len(LOOSE_TWINS)
    rows = dict(Job.objects.values_list("unique_key", "args"))
    assert rows["résumé-1"] == {"n": 0}
    assert {key: rows[key] for key in LOOSE_TWINS} == {
        key: {"n": i} for i, key in enumerate(LOOSE_TWINS)
    }


def test_a_worker_claims_only_its_queues_spelled_exactly():
    job = enqueue("test.noop", queue="casetest")
    assert claim(["CaseTest"]) == []
    assert claim(["casetest "]) == []
    assert claim(["casetest"]) == [job.pk]


def test_pausing_a_queue_pauses_only_that_spelling():
    emails = enqueue("test.noop", queue="emails")
    capital = enqueue("test.noop", queue="Emails")
    assert pausing.pause_queue("emails")
    assert pausing.pause_queue("Emails ")  # another queue: its own row
    assert pausing.paused_queues() == ("Emails ", "emails")
    assert claim(["emails", "Emails"]) == [capital.pk]
    assert pausing.resume_queue("emails")
    assert claim(["emails", "Emails"]) == [emails.pk]


def test_a_worker_claims_only_the_types_it_has_handlers_for_spelled_exactly():
    # No handler is registered as "TEST.NOOP": written directly, as another release would.
    other = Job.objects.create(type="TEST.NOOP", args={})
    accented = Job.objects.create(type="tést.noop", args={})
    padded = Job.objects.create(type="test.noop ", args={})
    ours = enqueue("test.noop")
    assert claim(["default"]) == [ours.pk]
    waiting = Job.objects.filter(pk__in=[other.pk, accented.pk, padded.pk])
    assert set(waiting.values_list("state", flat=True)) == {"ready"}


def _worker(pk: str) -> Worker:
    now = timezone.now()
    return Worker(id=pk, host="h", pid=1, concurrency=1, started_at=now, heartbeat_at=now)


@pytest.mark.parametrize(
    ("model", "make"),
    [
        (Worker, _worker),
        (Limit, lambda name: Limit(name=name)),
        (ScheduleState, lambda name: ScheduleState(name=name, last_slot=timezone.now())),
        (ScheduleDefinition, lambda name: ScheduleDefinition(name=name, every=5)),
        (Effect, lambda key: Effect(key=key)),
    ],
    ids=["worker-id", "limit-name", "schedule-name", "stored-schedule-name", "effect-key"],
)
def test_names_that_differ_only_loosely_are_distinct_rows(model: Any, make: Any):
    model.objects.bulk_create([make(name) for name in ["résumé-1", *LOOSE_TWINS]])
    field = model._meta.pk.name if model is not Effect else "key"
    for name in ["résumé-1", *LOOSE_TWINS]:
        assert list(model.objects.filter(**{field: name}).values_list(field, flat=True)) == [name]


def test_an_effect_recorded_under_one_spelling_is_not_recorded_under_another():
    from django.db import transaction

    with transaction.atomic():
        assert inbox.record_effect("charge:Ünïcode")
    with transaction.atomic():
        assert inbox.record_effect("charge:unicode")
        assert not inbox.record_effect("charge:Ünïcode")


def test_key_columns_keep_their_indexes_and_unique_constraints_on_mysql():
    collation = get_dialect("default").key_collation()
    if collation is None:
        pytest.skip("only MySQL/MariaDB give key columns a collation of their own")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT INDEX_NAME FROM information_schema.STATISTICS "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'django_jobqueue_job'"
        )
        indexes = {row[0] for row in cursor.fetchall()}
        cursor.execute(
            "SELECT COLUMN_NAME, COLLATION_NAME, IS_NULLABLE FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'django_jobqueue_job'"
        )
        columns = {name: (collation, nullable) for name, collation, nullable in cursor.fetchall()}
    assert {"jobqueue_job_ready_group", "jobqueue_job_unique_key_live"} <= indexes, indexes
    for name in ("type", "queue", "group_key", "lease_owner", "unique_key"):
        assert columns[name][0] == collation, (name, columns[name])
    assert columns["type"][1] == "NO" and columns["unique_key"][1] == "YES"
