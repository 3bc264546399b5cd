"""Rolling deploys: a job of a newer release waits for a worker that has its handler
(the reliability review: it failed on the earlier main)."""

from __future__ import annotations

import pytest
from django.db import connection

import django_jobqueue as jobqueue
from django_jobqueue import checks
from django_jobqueue.models import Job
from tests.conftest import wait_for_job

TERMINAL = (Job.State.DONE, Job.State.DEAD)


# -- rolling deploys ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_job_of_a_newer_release_waits_for_a_worker_that_has_its_handler(start_worker):
    """An old worker must not kill the jobs of a new release: it leaves them ready."""
    newer = Job.objects.create(type="test.new_release", args={}, max_attempts=1)
    old = start_worker("--poll-interval", "0.05")
    old.wait_registered()
    marker = jobqueue.enqueue("test.add", {"a": 1, "b": 1})
    assert wait_for_job(marker.pk, *TERMINAL).state == Job.State.DONE
    newer.refresh_from_db()
    assert (newer.state, newer.attempts) == (Job.State.READY, 0)
    assert "test.new_release" not in old.row().handlers
    warnings = checks.check_database(databases=[connection.alias])
    assert [m.id for m in warnings] == ["django_jobqueue.W005"]
    assert "test.new_release" in warnings[0].msg

    new = start_worker("--poll-interval", "0.05", env={"JOBQUEUE_TEST_NEW_RELEASE": "1"})
    done = wait_for_job(newer.pk, *TERMINAL)
    assert (done.state, done.result, done.attempts) == (Job.State.DONE, "new", 1)
    assert old.stop() == 0
    assert new.stop() == 0


@pytest.mark.django_db
def test_a_worker_of_the_release_before_registers_after_the_migrations():
    """Migrated first, as the deployment guide says: a worker still on the release before
    registers its row with the columns it knows, and the columns added since take their
    database defaults (process_key "", gone_at NULL, jobs_reclaimed 0): a live row."""
    from django.utils import timezone

    from django_jobqueue.models import Worker

    table = connection.ops.quote_name(Worker._meta.db_table)
    known = ["id", "host", "pid", "queues", "concurrency", "started_at", "heartbeat_at",
             "lease_ttl", "expires_at", "job_ids", "handlers", "handler_versions"]  # fmt: skip
    at = connection.ops.adapt_datetimefield_value(timezone.now())
    values = ["old-1", "host", 1, "[]", 4, at, at, 30.0, at, "[]", "[]", "{}"]
    columns = ", ".join(connection.ops.quote_name(c) for c in known)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['%s'] * len(known))})", values
        )
    row = Worker.objects.get(pk="old-1")
    assert (row.process_key, row.gone_at, row.jobs_reclaimed) == ("", None, 0)
    assert Worker.objects.live().filter(pk="old-1").exists()
