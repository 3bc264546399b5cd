"""Signals for every job: enqueued on commit; started/finished/failed/dead from a real worker."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction

import django_jobqueue as jobqueue
from django_jobqueue import signals
from django_jobqueue.models import Job
from tests.conftest import assert_clean_log, wait_for_job

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def received() -> Any:
    """Collect job_enqueued sends in this process."""
    got: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        got.append({"sender": sender, **kwargs})

    signals.job_enqueued.connect(receiver)
    yield got
    signals.job_enqueued.disconnect(receiver)


def test_enqueued_is_sent_after_commit_and_never_on_rollback(received):
    with transaction.atomic():
        job = jobqueue.enqueue("test.add", {"a": 1, "b": 2}, group="g", queue="mail")
        assert received == []  # not committed yet
    assert len(received) == 1
    sent = received[0]
    assert sent["sender"] is Job
    assert (sent["job_id"], sent["job_type"], sent["queue"], sent["group"]) == (
        job.pk,
        "test.add",
        "mail",
        "g",
    )
    assert sent["job"] is job
    with pytest.raises(RuntimeError), transaction.atomic():
        jobqueue.enqueue("test.noop")
        raise RuntimeError("roll back")
    assert len(received) == 1


def test_enqueued_for_every_job_of_a_graph(received):
    with jobqueue.graph() as g:
        first = g.add("test.noop")
        g.add("test.noop", depends_on=[first])
    assert len(received) == 2
    assert jobqueue.enqueue_many([("test.noop", {}), ("test.noop", {})])
    assert len(received) == 4


def test_a_raising_receiver_is_logged_and_the_others_still_run(received, caplog):
    def bad(sender: Any, **kwargs: Any) -> None:
        raise ValueError("receiver bug")

    signals.job_enqueued.connect(bad)
    try:
        with caplog.at_level(logging.ERROR, logger="django_jobqueue.signals"):
            job = jobqueue.enqueue("test.noop")
    finally:
        signals.job_enqueued.disconnect(bad)
    assert job.pk is not None
    assert len(received) == 1
    assert "receiver bug" in caplog.text


def test_no_receiver_means_nothing_is_sent():
    assert not signals.connected(signals.job_started)
    assert not signals.connected(signals.job_finished)


def read_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_worker_sends_signals_for_each_attempt(start_worker, tmp_path):
    log = tmp_path / "signals.jsonl"
    ok = jobqueue.enqueue("test.add", {"a": 2, "b": 3}, group="sums")
    flaky = jobqueue.enqueue("test.fail_then_succeed", {"failures": 1}, max_attempts=3)
    doomed = jobqueue.enqueue("test.fail", {"message": "nope"}, max_attempts=2, queue="q2")
    worker = start_worker("--concurrency", "2", env={"JOBQUEUE_TEST_SIGNAL_LOG": str(log)})
    for job in (ok, flaky):
        wait_for_job(job.pk, "done")
    wait_for_job(doomed.pk, "dead")
    assert worker.stop() == 0, worker.output()
    assert_clean_log(worker.output())
    events = read_log(log)

    def of(pk: int, name: str) -> list[dict[str, Any]]:
        return [e for e in events if e["job_id"] == pk and e["signal"] == name]

    assert all(e["sender"] == "Job" for e in events)
    (started,) = of(ok.pk, "started")
    assert (started["job_type"], started["attempt"], started["group"]) == ("test.add", 1, "sums")
    assert started["worker_id"] == Job.objects.get(pk=ok.pk).worker_ids[0]
    (finished,) = of(ok.pk, "finished")
    assert (finished["state"], finished["result"], finished["attempt"]) == ("done", 5, 1)
    assert finished["duration"] >= 0
    assert finished["thread"] == "jobqueue-completer"  # after the write, on its thread
    assert [e["attempt"] for e in of(flaky.pk, "started")] == [1, 2]
    (failed,) = of(flaky.pk, "failed")
    assert failed["state"] in ("ready", "scheduled")
    assert failed["error"] == "RuntimeError: failing attempt 1"
    assert of(flaky.pk, "dead") == []
    assert [e["attempt"] for e in of(doomed.pk, "failed")] == [1, 2]
    assert [e["state"] for e in of(doomed.pk, "failed")][-1] == "dead"
    (dead,) = of(doomed.pk, "dead")
    assert (dead["queue"], dead["attempt"], dead["error"]) == ("q2", 2, "RuntimeError: nope")


def test_a_raising_receiver_never_stops_the_worker(start_worker, tmp_path):
    log = tmp_path / "signals.jsonl"
    jobs = [jobqueue.enqueue("test.add", {"a": n, "b": 1}) for n in range(5)]
    worker = start_worker(
        "--burst",
        env={"JOBQUEUE_TEST_SIGNAL_LOG": str(log), "JOBQUEUE_TEST_SIGNAL_RAISE": "1"},
    )
    assert worker.wait() == 0, worker.output()
    for job in jobs:
        wait_for_job(job.pk, "done")
    output = worker.output()
    assert "a receiver that raises" in output
    assert len([e for e in read_log(log) if e["signal"] == "finished"]) == 5


def test_a_receiver_raising_system_exit_is_logged_too(caplog):
    def leave(sender: Any, **kwargs: Any) -> None:
        raise SystemExit(3)

    signals.job_enqueued.connect(leave)
    try:
        with caplog.at_level(logging.ERROR, logger="django_jobqueue.signals"):
            job = jobqueue.enqueue("test.noop")
    finally:
        signals.job_enqueued.disconnect(leave)
    assert job.pk is not None
    assert "A receiver of job_enqueued raised" in caplog.text


def test_a_job_cancelled_while_running_finishes_cancelled_without_result(start_worker, tmp_path):
    log = tmp_path / "signals.jsonl"
    job = jobqueue.enqueue("wf.until_cancelled")
    worker = start_worker(env={"JOBQUEUE_TEST_SIGNAL_LOG": str(log)})
    wait_for_job(job.pk, "running")
    assert jobqueue.cancel(job.pk)
    wait_for_job(job.pk, "cancelled")
    assert worker.stop() == 0, worker.output()
    [finished] = [e for e in read_log(log) if e["signal"] == "finished"]
    assert (finished["job_id"], finished["state"], finished["result"]) == (
        job.pk,
        "cancelled",
        None,
    )
