"""A handler whose query cannot connect (its server is away) fails that attempt only: the
worker's thread survives, and the job is retried (found by the MariaDB restart run)."""

from __future__ import annotations

import pytest

import django_jobqueue as jobqueue
from django_jobqueue.models import Job
from tests.chaos.support import check_log
from tests.conftest import wait_for_job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.chaos, pytest.mark.slow]


def test_handler_that_cannot_connect_fails_its_attempt_and_its_thread_lives_on(start_worker):
    worker = start_worker("--concurrency", "1", env={"PYTHONFAULTHANDLER": "1"})
    job = jobqueue.enqueue("chaos.cannot_connect_once", max_attempts=3)
    after = jobqueue.enqueue("test.add", {"a": 2, "b": 3})
    done = wait_for_job(job.pk, Job.State.DONE, Job.State.DEAD, timeout=30)
    assert done.state == Job.State.DONE
    assert done.result == 2
    assert [e["type"] for e in done.errors] == ["django.db.utils.OperationalError"]
    assert wait_for_job(after.pk, Job.State.DONE, Job.State.DEAD, timeout=30).result == 5
    assert "Exception in thread" not in worker.output()
    assert worker.stop() == 0
    check_log(worker)
