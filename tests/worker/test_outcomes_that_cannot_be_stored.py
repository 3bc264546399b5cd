"""A result or an error message no database could store: the attempt fails at once, or the
message is cleaned and cut; the error history keeps the latest entries (the reliability
review: each failed on the earlier main)."""

from __future__ import annotations

from typing import Any

import pytest

import django_jobqueue as jobqueue
from django_jobqueue.engine import error_records
from django_jobqueue.models import Job
from tests.conftest import wait_for_job

TERMINAL = (Job.State.DONE, Job.State.DEAD)


# -- outcomes that cannot be stored, error records ---------------------------------------------


@pytest.mark.parametrize("kind", ["nul", "surrogate", "big"])
@pytest.mark.django_db(transaction=True)
def test_a_result_no_database_can_store_kills_the_attempt_at_once(start_worker, kind: str):
    job = jobqueue.enqueue("test.unstorable_result", {"kind": kind}, max_attempts=3)
    worker = start_worker("--poll-interval", "0.05")
    dead = wait_for_job(job.pk, *TERMINAL)
    assert worker.stop() == 0
    assert dead.state == Job.State.DEAD
    assert dead.attempts == 1  # not run again, and not taken for a lost lease
    assert dead.last_error["type"] == "django_jobqueue.exceptions.ResultNotStored"
    assert "cannot store its result" in dead.last_error["message"]
    assert dead.result is None


@pytest.mark.django_db(transaction=True)
def test_an_error_message_no_database_can_store_is_cleaned_and_cut(start_worker):
    job = jobqueue.enqueue("test.nasty_error", max_attempts=2)
    worker = start_worker("--poll-interval", "0.05")
    dead = wait_for_job(job.pk, *TERMINAL, timeout=90)
    assert worker.stop() == 0
    assert dead.state == Job.State.DEAD
    assert dead.attempts == 2  # a failure like any other: retried, then dead
    message = dead.last_error["message"]
    assert message.startswith("badbyte \\udc80 y")
    assert "\x00" not in message
    assert len(message) < error_records.MAX_ERROR_MESSAGE + 100
    assert len(dead.last_error["traceback"]) < error_records.MAX_ERROR_TRACEBACK + 100
    assert len(dead.errors) == 2


def test_the_error_history_keeps_the_latest_entries() -> None:
    history: list[dict[str, Any]] = []
    for attempt in range(1, 100):
        history = error_records.with_error(history, {"attempt": attempt})
    assert len(history) == error_records.MAX_ERROR_HISTORY
    assert history[-1] == {"attempt": 99}
