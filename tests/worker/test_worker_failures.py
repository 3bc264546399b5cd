"""What a worker process does with failing jobs: retry with backoff, Retry, Fail, give up."""

from __future__ import annotations

import datetime as dt

import pytest

import django_jobqueue as jobqueue
from django_jobqueue.models import Job
from tests.conftest import assert_clean_log, wait_for_job

pytestmark = pytest.mark.django_db(transaction=True)

TERMINAL = (Job.State.DONE, Job.State.DEAD)


def test_failing_job_is_retried_with_backoff_until_it_succeeds(start_worker):
    job = jobqueue.enqueue("test.fail_then_succeed", {"failures": 2}, max_attempts=3)
    worker = start_worker()
    done = wait_for_job(job.pk, *TERMINAL)
    assert worker.stop() == 0
    assert done.state == Job.State.DONE, done.last_error
    assert done.result == "ok on attempt 3"
    assert done.attempts == 3
    # The failure of the attempt before the successful one stays on record.
    assert done.last_error["type"] == "builtins.RuntimeError"
    assert done.last_error["message"] == "failing attempt 2"
    assert done.last_error["attempt"] == 2
    # One error per failed attempt is kept, oldest first.
    assert [(e["attempt"], e["message"]) for e in done.errors] == [
        (1, "failing attempt 1"),
        (2, "failing attempt 2"),
    ]
    # Each retry waited for its backoff: the run_after of the last retry had passed at start.
    assert done.run_after is not None
    assert done.started_at >= done.run_after
    log = worker.output()
    assert log.count("failed after") == 2
    assert "retry in" in log
    assert_clean_log(log)


def test_retry_exception_reschedules_the_job_after_its_delay(start_worker):
    job = jobqueue.enqueue("test.retry_once", {"delay": 1.0}, max_attempts=3)
    worker = start_worker()
    done = wait_for_job(job.pk, *TERMINAL)
    assert worker.stop() == 0
    assert done.state == Job.State.DONE, done.last_error
    assert done.result == 2
    assert done.attempts == 2
    assert done.last_error["type"] == "django_jobqueue.exceptions.Retry"
    # run_after was set one second past the failed attempt, and the retry waited for it.
    assert done.started_at >= done.run_after
    assert done.started_at - done.created_at >= dt.timedelta(seconds=1)
    assert "retry asked for: delay=1.0" in worker.output()
    assert_clean_log(worker.output())


def test_fail_exception_kills_the_job_at_once(start_worker):
    job = jobqueue.enqueue("test.fail_hard", max_attempts=5)
    worker = start_worker()
    dead = wait_for_job(job.pk, *TERMINAL)
    assert worker.stop() == 0
    assert dead.state == Job.State.DEAD
    assert dead.attempts == 1  # no retries, whatever max_attempts allows
    assert dead.finished_at is not None
    assert dead.last_error["type"] == "django_jobqueue.exceptions.Fail"
    assert dead.last_error["message"] == "not worth retrying"
    assert "raise jobqueue.Fail" in dead.last_error["traceback"]
    assert dead.result is None
    assert_clean_log(worker.output())


def test_job_that_keeps_failing_is_dead_after_max_attempts(start_worker):
    job = jobqueue.enqueue("test.fail", {"message": "kaboom"}, max_attempts=2)
    worker = start_worker()
    dead = wait_for_job(job.pk, *TERMINAL)
    assert worker.stop() == 0
    assert dead.state == Job.State.DEAD
    assert dead.attempts == 2
    assert dead.finished_at is not None
    assert dead.lease_owner is None
    error = dead.last_error
    assert error["type"] == "builtins.RuntimeError"
    assert error["message"] == "kaboom"
    assert error["attempt"] == 2
    assert error["traceback"].startswith("Traceback (most recent call last):")
    assert "raise RuntimeError(message)" in error["traceback"]
    assert "RuntimeError: kaboom" in error["traceback"]
    assert [e["attempt"] for e in dead.errors] == [1, 2]
    assert "died after" in worker.output()


def test_result_that_is_not_json_kills_the_job_at_once(start_worker):
    """Deterministic: running the handler again would repeat its side effects for nothing."""
    job = jobqueue.enqueue("test.bad_result", max_attempts=3)
    worker = start_worker()
    dead = wait_for_job(job.pk, *TERMINAL)
    assert worker.stop() == 0
    assert dead.state == Job.State.DEAD
    assert dead.attempts == 1
    assert dead.last_error["type"] == "django_jobqueue.exceptions.ResultNotStored"
    assert "not JSON-serializable" in dead.last_error["message"]
    assert dead.result is None


def test_job_without_a_handler_here_is_left_ready_and_the_worker_goes_on(start_worker):
    """A row whose handler this worker lacks (a newer release's, or one removed) is not
    claimed: it neither dies nor stops the worker (tests/test_reliability.py has the deploy)."""
    orphan = Job.objects.create(type="test.no_such_handler", args={}, max_attempts=5)
    worker = start_worker()
    after = jobqueue.enqueue("test.add", {"a": 2, "b": 3})
    done = wait_for_job(after.pk, *TERMINAL)
    assert done.state == Job.State.DONE
    assert done.result == 5
    orphan.refresh_from_db()
    assert (orphan.state, orphan.attempts) == (Job.State.READY, 0)
    assert worker.running()
    assert worker.stop() == 0
    assert_clean_log(worker.output())


def test_one_failing_job_does_not_hold_up_the_others(start_worker):
    bad = jobqueue.enqueue("test.fail", max_attempts=1, priority=10)
    good = [jobqueue.enqueue("test.add", {"a": i, "b": i}) for i in range(5)]
    worker = start_worker("--concurrency", "2")
    assert wait_for_job(bad.pk, *TERMINAL).state == Job.State.DEAD
    for i, job in enumerate(good):
        done = wait_for_job(job.pk, *TERMINAL)
        assert done.state == Job.State.DONE
        assert done.result == 2 * i
    assert worker.stop() == 0


@pytest.mark.parametrize("forced", [False, True], ids=["raised", "past-the-checks"])
def test_bad_retry_argument_fails_its_job_and_the_worker_records_the_next(start_worker, forced):
    """Retry(at="tomorrow"), Retry(at=12345), Retry(delay=Decimal("5")): raised, Retry refuses
    them (the TypeError is the attempt's error); set past its checks, the completer cannot
    write them and records a plain failure (backoff, then dead on the last attempt) instead.
    Either way the worker goes on recording the next job's outcome."""
    from tests.testapp.jobs import BAD_RETRIES

    worker = start_worker("--concurrency", "1")
    worker.wait_registered()
    for kind in BAD_RETRIES:
        # Retry's plan is used only with attempts left: a forced one needs two.
        bad = jobqueue.enqueue(
            "test.bad_retry", {"kind": kind, "forced": forced}, max_attempts=2 if forced else 1
        )
        dead = wait_for_job(bad.pk, *TERMINAL)
        assert dead.state == Job.State.DEAD
        assert dead.lease_owner is None
        first = dead.errors[0]
        if forced:
            assert dead.attempts == 2
            assert first["type"] == "django_jobqueue.exceptions.Retry"
            assert "could not be recorded as planned" in first["message"]
            assert f"forced {kind}" == dead.last_error["message"]
            assert dead.started_at >= dead.run_after  # the second attempt waited for backoff
        else:
            assert dead.attempts == 1
            assert first["type"] == "builtins.TypeError"
            assert first["message"].startswith("Retry ")
        after = jobqueue.enqueue("test.add", {"a": 1, "b": 2})
        done = wait_for_job(after.pk, *TERMINAL)
        assert (done.state, done.result) == (Job.State.DONE, 3)
    assert worker.stop() == 0
    log = worker.output()
    if forced:
        assert log.count("Could not record the outcome of job") == len(BAD_RETRIES)
        assert "retry asked for" not in log  # the plain failure waits for the usual backoff
    assert_clean_log(log, allow=("Could not record",) if forced else ())


def test_args_and_results_nested_to_the_limit_round_trip_and_deeper_ones_are_refused(
    start_worker,
):
    """30 levels are stored on every database; 31 are refused before the write (MariaDB's
    JSON_VALID would refuse 32 with an IntegrityError): args at enqueue, a result by failing
    its job with ResultNotStored, and the worker goes on."""
    from django_jobqueue.exceptions import InvalidArgumentsError
    from tests.enqueue.test_validation import _nested

    deepest = jobqueue.enqueue("test.noop", {"d": _nested(29)})  # with the args object: 30
    deepest.refresh_from_db()
    assert deepest.args == {"d": _nested(29)}
    with pytest.raises(InvalidArgumentsError, match="more than 30 levels"):
        jobqueue.enqueue("test.noop", {"d": _nested(30)})
    kept = jobqueue.enqueue("test.deep_result", {"levels": 30})
    refused = jobqueue.enqueue("test.deep_result", {"levels": 31}, max_attempts=3)
    after = jobqueue.enqueue("test.add", {"a": 2, "b": 2}, priority=-1)
    worker = start_worker("--concurrency", "1")
    done = wait_for_job(kept.pk, *TERMINAL)
    assert (done.state, done.result) == (Job.State.DONE, _nested(30))
    dead = wait_for_job(refused.pk, *TERMINAL)
    assert (dead.state, dead.attempts) == (Job.State.DEAD, 1)
    assert dead.last_error["type"] == "django_jobqueue.exceptions.ResultNotStored"
    assert "more than 30 levels" in dead.last_error["message"]
    assert wait_for_job(after.pk, *TERMINAL).result == 4
    assert worker.stop() == 0
    assert_clean_log(worker.output())


@pytest.mark.parametrize("kind", ["long", "lines", "broken-str"])
def test_a_log_line_carries_a_bounded_one_line_message_whatever_the_exception(caplog, kind):
    """A megabyte message, one that forges log lines, one whose __str__ raises: each failure
    is one bounded line (the stored error keeps its own, longer, record)."""
    import logging

    from django_jobqueue.engine.error_records import MAX_LOG_MESSAGE
    from django_jobqueue.testing import run_jobs

    job = jobqueue.enqueue("test.loud_error", {"kind": kind}, max_attempts=1)
    with caplog.at_level(logging.WARNING, logger="django_jobqueue"):
        run_jobs()
    job.refresh_from_db()
    assert job.state == Job.State.DEAD
    lines = [r.getMessage() for r in caplog.records if f"Job id={job.pk} " in r.getMessage()]
    assert len(lines) == 1, lines
    (line,) = lines
    assert "\n" not in line and "\r" not in line
    assert len(line) < MAX_LOG_MESSAGE + 300  # the job's fields and the "cut" mark
    assert "died after" in line
    if kind == "long":
        assert "[... 998,000 characters cut ...]" in line
    if kind == "lines":
        assert "first\\nJob id=1 type=test.add attempt=1 done\\n" in line
    if kind == "broken-str":
        assert "<BrokenStr whose str() failed>" in line
        assert job.last_error["message"] == "<BrokenStr whose str() failed>"


def test_log_text_escapes_control_characters_and_cuts():
    from django_jobqueue.engine.error_records import log_text

    assert log_text(RuntimeError("a\x1b[2J\r\nb\x00\u202e\ud800")) == (
        "a\\x1b[2J\\r\\nb\\x00\\u202e\\ud800"
    )
    assert log_text("é ok \u200d") == "é ok \u200d"  # letters and joiners stay as they are
    assert log_text("\n" * 5000, limit=10) == "\\n" * 5 + "[... 4,990 characters cut ...]"


def test_a_handler_thread_whose_connect_raises_runs_its_job_and_lives_on(caplog):
    """A `connection_created` receiver that raises in a handler thread (not a database error:
    nothing to hand back for) is logged, and the jobs run; before, the thread died with its
    job claimed and an in-process burst worker waited for it for ever."""
    import threading

    from django.db.backends.signals import connection_created

    from django_jobqueue.worker import JobWorker, WorkerOptions

    def broken(sender: object, connection: object, **kwargs: object) -> None:
        if threading.current_thread().name == "jobqueue-exec":
            raise RuntimeError("a broken connection_created receiver")

    jobs = [jobqueue.enqueue("test.add", {"a": i, "b": 1}) for i in range(3)]
    ended: list[int] = []

    def run() -> None:
        try:
            ended.append(
                JobWorker(WorkerOptions(burst=True, concurrency=2)).run(install_signals=False)
            )
        finally:
            from django.db import connections

            connections.close_all()

    connection_created.connect(broken, weak=False)
    try:
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(120)
    finally:
        connection_created.disconnect(broken)
    assert not thread.is_alive(), "the burst worker never ended"
    assert ended == [0]
    assert [Job.objects.get(pk=job.pk).result for job in jobs] == [1, 2, 3]
    assert "Could not set up the connection of a handler thread" in caplog.text
