"""django_jobqueue.testing: run_jobs(), the assertions, capture_enqueued(), the job_queue fixture.

Against the real test database, in ordinary (transaction-wrapped) tests unless said otherwise:
running jobs inside the test's transaction is the point.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import django
import pytest
from django.db import connection
from django.test import TestCase

import django_jobqueue as jobqueue
from django_jobqueue.models import Job
from django_jobqueue.testing import (
    CapturedJobs,
    RunawayJobsError,
    assert_enqueued,
    assert_not_enqueued,
    capture_enqueued,
    enqueued_jobs,
    run_jobs,
)
from django_jobqueue.testing.pytest_plugin import JobQueueFixture
from tests.conftest import ROOT
from tests.support.markers import requires_tasks
from tests.testapp import testing_jobs
from tests.testapp.models import Order, RunRecord

HAS_TASKS = django.VERSION >= (6, 0)

if HAS_TASKS:
    from django.tasks import TaskResultStatus

    from tests.testapp import tasks

pytestmark = pytest.mark.django_db


def record(label: str, **options: Any) -> Job:
    fail_until = options.pop("fail_until", 0)
    return jobqueue.enqueue("helpers.record", {"label": label, "fail_until": fail_until}, **options)


def refreshed(*jobs: Job) -> list[Job]:
    for job in jobs:
        job.refresh_from_db()
    return list(jobs)


@pytest.fixture
def slow_backoff(settings: Any) -> None:
    """A retry backoff of an hour: a test that passes did not wait for it."""
    settings.JOBQUEUE = {**settings.JOBQUEUE, "RETRY_BACKOFF": 3600, "RETRY_BACKOFF_MAX": 3600}


# -- run_jobs --------------------------------------------------------------------------------


def test_a_dag_runs_upstream_first_inside_the_test_transaction() -> None:
    assert connection.in_atomic_block  # the test's own transaction: no transaction=True
    a = record("a")
    b = record("b", depends_on=[a])
    assert refreshed(b)[0].state == Job.State.WAITING

    report = run_jobs()

    assert [job.pk for job in report.jobs] == [a.pk, b.pk]
    assert report.attempts == 2 and len(report) == 2
    assert report.counts == {"done": 2}
    assert report.jobs[1].result == {"label": "b", "saw": ["a"]}
    assert report.of_type("helpers.record") == report.jobs
    assert refreshed(a, b)[1].state == Job.State.DONE
    assert run_jobs().jobs == []  # nothing left


@pytest.mark.parametrize("forced", [False, True], ids=["raised", "past-the-checks"])
def test_a_bad_retry_argument_fails_its_job_and_run_jobs_goes_on(forced: bool) -> None:
    """As in the worker: a bad Retry fails its own job; the next job still runs and is done."""
    from tests.testapp.jobs import BAD_RETRIES

    for kind in BAD_RETRIES:
        bad = jobqueue.enqueue(
            "test.bad_retry", {"kind": kind, "forced": forced}, max_attempts=2 if forced else 1
        )
        after = jobqueue.enqueue("test.add", {"a": 1, "b": 2}, priority=-1)

        run_jobs()

        bad.refresh_from_db()
        after.refresh_from_db()
        assert bad.state == Job.State.DEAD
        if forced:
            assert "could not be recorded as planned" in bad.errors[0]["message"]
        else:
            assert bad.errors[0]["type"] == "builtins.TypeError"
        assert (after.state, after.result) == (Job.State.DONE, 3)


def test_handlers_see_the_tests_uncommitted_rows() -> None:
    Order.objects.create(number="A-1")
    Order.objects.create(number="A-2")
    job = jobqueue.enqueue("helpers.count_orders")

    run_jobs()

    job.refresh_from_db()
    assert job.state == Job.State.DONE, job.last_error
    assert job.result == 2


def test_a_container_rolls_up_before_its_downstream_job_runs() -> None:
    with jobqueue.container("batch") as box:
        first = record("child-1", parent=box)
        second = record("child-2", parent=box)
    after = record("after", depends_on=[box])

    report = run_jobs()

    assert [job.pk for job in report.jobs] == [first.pk, second.pk, after.pk]
    box.refresh_from_db()
    assert box.state == Job.State.DONE  # a container never runs: it rolls up
    assert refreshed(after)[0].state == Job.State.DONE


def test_a_failed_container_child_kills_the_container_and_cancels_downstream() -> None:
    with jobqueue.container("batch") as box:
        good = record("good", parent=box)
        bad = jobqueue.enqueue("test.fail_hard", parent=box)
    after = record("after", depends_on=[box])

    run_jobs()

    good, bad, box, after = refreshed(good, bad, box, after)
    assert (good.state, bad.state) == (Job.State.DONE, Job.State.DEAD)
    assert box.state == Job.State.DEAD
    assert after.state == Job.State.CANCELLED and after.cancelled_by_id == box.pk


def test_a_retry_runs_again_without_waiting_for_its_backoff(slow_backoff: None) -> None:
    job = record("flaky", fail_until=1, max_attempts=3)
    started = time.monotonic()

    report = run_jobs()

    assert time.monotonic() - started < 30  # the backoff is an hour
    assert report.attempts == 2 and report.counts == {"done": 1}
    job.refresh_from_db()
    assert job.state == Job.State.DONE and job.attempts == 2
    assert [e["message"] for e in job.errors] == ["flaky: attempt 1 fails"]
    assert RunRecord.objects.filter(job_id=job.pk).count() == 2  # the failed attempt's row stays


def test_retry_with_a_delay_and_run_after_are_due_at_once() -> None:
    retried = jobqueue.enqueue("test.retry_once", {"delay": 3600})
    later = jobqueue.enqueue("test.add", {"a": 1, "b": 2}, run_after=dt_hours(5))
    assert refreshed(later)[0].state == Job.State.SCHEDULED

    report = run_jobs()

    retried, later = refreshed(retried, later)
    assert (retried.state, retried.result, retried.attempts) == (Job.State.DONE, 2, 2)
    assert (later.state, later.result) == (Job.State.DONE, 3)
    assert report.attempts == 3


def test_with_ignore_delays_false_delayed_jobs_wait(slow_backoff: None) -> None:
    job = record("flaky", fail_until=1)
    later = jobqueue.enqueue("test.add", {"a": 1, "b": 2}, run_after=dt_hours(5))
    now = jobqueue.enqueue("test.add", {"a": 2, "b": 2})

    report = run_jobs(ignore_delays=False)

    assert [j.pk for j in report.jobs] == [job.pk, now.pk]
    assert report.counts == {"scheduled": 1, "done": 1}
    assert refreshed(later)[0].state == Job.State.SCHEDULED
    # The next call with delays ignored finishes both.
    assert run_jobs().counts == {"done": 2}


def test_exhausted_attempts_end_dead_and_cancel_the_downstream_jobs(slow_backoff: None) -> None:
    a = record("a", fail_until=99, max_attempts=2)
    b = record("b", depends_on=[a])
    c = record("c", depends_on=[b])

    report = run_jobs()

    assert report.attempts == 2 and report.counts == {"dead": 1}
    a, b, c = refreshed(a, b, c)
    assert a.state == Job.State.DEAD and a.attempts == 2
    assert a.last_error["message"] == "a: attempt 2 fails"
    assert (b.state, c.state) == (Job.State.CANCELLED, Job.State.CANCELLED)
    assert b.cancelled_by_id == a.pk and c.cancelled_by_id == a.pk
    # Retrying the dead job revives its downstream jobs, and run_jobs() runs them all.
    jobqueue.retry(a)
    Job.objects.filter(pk=a.pk).update(args={"label": "a", "fail_until": 0})
    assert run_jobs().counts == {"done": 3}


def test_fail_and_unstorable_results_end_dead_at_once() -> None:
    hard = jobqueue.enqueue("test.fail_hard", max_attempts=5)
    bad = jobqueue.enqueue("test.bad_result", max_attempts=5)

    report = run_jobs()

    assert report.attempts == 2 and report.counts == {"dead": 2}
    hard, bad = refreshed(hard, bad)
    assert hard.last_error["type"] == "django_jobqueue.exceptions.Fail"
    assert bad.last_error["type"] == "django_jobqueue.exceptions.ResultNotStored"


def test_a_cancelled_job_and_its_downstream_never_run() -> None:
    a = record("a")
    b = record("b", depends_on=[a])
    other = record("other")
    assert jobqueue.cancel(a)

    report = run_jobs()

    assert [job.pk for job in report.jobs] == [other.pk]
    a, b = refreshed(a, b)
    assert (a.state, b.state) == (Job.State.CANCELLED, Job.State.CANCELLED)
    assert not RunRecord.objects.filter(job_id__in=[a.pk, b.pk]).exists()


def test_a_job_cancelled_while_it_runs_ends_cancelled() -> None:
    job = jobqueue.enqueue("helpers.cancel_self")
    after = record("after", depends_on=[job])

    report = run_jobs()

    assert report.counts == {"cancelled": 1}
    job, after = refreshed(job, after)
    assert job.state == Job.State.CANCELLED and job.result is None
    assert after.state == Job.State.CANCELLED


def test_the_context_and_the_signals_work_as_in_a_worker() -> None:
    from django_jobqueue import signals

    seen: list[tuple[str, str, Any]] = []

    def receiver(signal: Any, **kwargs: Any) -> None:
        name = {signals.job_started: "started", signals.job_finished: "finished",
                signals.job_failed: "failed", signals.job_dead: "dead"}[signal]  # fmt: skip
        seen.append((name, kwargs["job_type"], kwargs.get("state")))

    hooked = (signals.job_started, signals.job_finished, signals.job_failed, signals.job_dead)
    for signal in hooked:
        signal.connect(receiver)
    try:
        job = jobqueue.enqueue("helpers.context")
        jobqueue.enqueue("test.fail_hard")
        run_jobs()
    finally:
        for signal in hooked:
            signal.disconnect(receiver)

    assert refreshed(job)[0].result == {"attempt": 1, "renewed": True, "cancelled": False}
    assert seen == [
        ("started", "helpers.context", None),
        ("finished", "helpers.context", "done"),
        ("started", "test.fail_hard", None),
        ("failed", "test.fail_hard", "dead"),
        ("dead", "test.fail_hard", None),
    ]


def test_a_database_error_in_a_handler_leaves_the_test_transaction_usable() -> None:
    job = jobqueue.enqueue("helpers.db_error", max_attempts=1)
    Order.objects.create(number="kept")

    report = run_jobs()

    assert report.counts == {"dead": 1}
    assert "IntegrityError" in refreshed(job)[0].last_error["type"]
    # The failed attempt's writes were rolled back with it; the test's own rows are intact.
    assert not RunRecord.objects.filter(job_id=job.pk).exists()
    assert Order.objects.get().number == "kept"


def test_jobs_enqueued_by_handlers_run_too() -> None:
    jobqueue.enqueue("helpers.fan_out", {"count": 3})

    report = run_jobs()

    assert report.attempts == 4
    assert [job.result for job in report.of_type("test.add")] == [1, 2, 3]


def test_queues_limits_the_run() -> None:
    mail = jobqueue.enqueue("test.add", {"a": 1, "b": 1}, queue="emails")
    other = jobqueue.enqueue("test.add", {"a": 2, "b": 2})

    assert [job.pk for job in run_jobs(queues=["emails"]).jobs] == [mail.pk]
    assert refreshed(other)[0].state == Job.State.READY
    assert run_jobs(queues="emails").jobs == []  # one name will do
    assert [job.pk for job in run_jobs(queues="default").jobs] == [other.pk]


def test_paused_queues_stay_paused() -> None:
    from django_jobqueue.pausing import pause_queue, resume_queue

    job = jobqueue.enqueue("test.add", {"a": 1, "b": 1}, queue="emails")
    pause_queue("emails")
    assert run_jobs().jobs == []
    resume_queue("emails")
    assert run_jobs().jobs == [job]


def test_a_runaway_handler_stops_with_a_clear_error() -> None:
    jobqueue.enqueue("helpers.forever")

    with pytest.raises(RunawayJobsError, match=r"after 5 attempts.*helpers\.forever.*max_runs"):
        run_jobs(max_runs=5)

    assert Job.objects.filter(state=Job.State.DONE).count() == 5
    # The job that would have run sixth is back to ready, not charged an attempt.
    waiting = Job.objects.get(state=Job.State.READY)
    assert (waiting.attempts, waiting.args) == (0, {"n": 5})
    with pytest.raises(ValueError, match="max_runs"):
        run_jobs(max_runs=0)


@pytest.mark.django_db(transaction=True)
def test_run_jobs_also_works_with_real_transactions(slow_backoff: None) -> None:
    assert not connection.in_atomic_block
    a = record("a", fail_until=1)
    b = record("b", depends_on=[a])

    report = run_jobs()

    assert [job.pk for job in report.jobs] == [a.pk, b.pk]
    assert report.attempts == 3 and report.counts == {"done": 2}


# -- assertions ------------------------------------------------------------------------------


def test_assert_enqueued_matches_type_args_and_fields() -> None:
    a = record("a", queue="emails", group="acme", priority=5)
    b = record("b", depends_on=[a])
    record("b")

    assert assert_enqueued("helpers.record", {"label": "a", "fail_until": 0}) == [a]
    assert_enqueued(testing_jobs.record, count=3)  # the handler function names its key
    assert_enqueued("helpers.record", queue="emails", group="acme", priority__gte=5)
    assert assert_enqueued("helpers.record", depends_on=a) == [b]
    assert_enqueued("helpers.record", {"label": "b", "fail_until": 0}, count=2)
    assert_not_enqueued("helpers.record", {"label": "c", "fail_until": 0})
    assert_not_enqueued("test.add")
    assert enqueued_jobs("helpers.record", state="waiting") == [b]
    assert len(enqueued_jobs()) == 3


def test_assert_enqueued_lists_what_was_enqueued_when_nothing_matches() -> None:
    a = jobqueue.enqueue("test.add", {"a": 1, "b": 2}, queue="emails")
    jobqueue.enqueue("test.noop")

    with pytest.raises(AssertionError) as failure:
        assert_enqueued("test.add", {"a": 1, "b": 3})

    message = str(failure.value)
    assert message.startswith(
        "Expected at least one job 'test.add' with args={'a': 1, 'b': 3} in the "
        "queue, found 0.\nJobs enqueued (2):\n"
    )
    assert f"#{a.pk} 'test.add' args={{'a': 1, 'b': 2}} queue='emails' state=ready" in message
    assert "'test.noop' args={}" in message


def test_assert_enqueued_with_count_lists_the_matches() -> None:
    jobqueue.enqueue("test.add", {"a": 1, "b": 2})
    jobqueue.enqueue("test.add", {"a": 1, "b": 2})

    with pytest.raises(
        AssertionError, match=r"Expected 1 job 'test.add' with .* found 2\.\nMatching jobs \(2\)"
    ):
        assert_enqueued("test.add", {"a": 1, "b": 2}, count=1)


def test_assert_enqueued_names_every_condition() -> None:
    box_job = jobqueue.enqueue("test.add", {"a": 1, "b": 2}, queue="emails")

    with pytest.raises(AssertionError) as failure:
        assert_enqueued("test.add", count=2, queue="emails", group="acme", depends_on=box_job)

    assert str(failure.value).startswith(
        "Expected 2 jobs 'test.add' with queue='emails', group_key='acme', "
        f"depends_on=[{box_job.pk}] in the queue, found 0.\nJobs enqueued (1):\n"
    )


def test_assert_enqueued_with_nothing_enqueued() -> None:
    with pytest.raises(AssertionError, match=r"found 0\.\nJobs enqueued: none\.$"):
        assert_enqueued("test.add")


def test_assert_not_enqueued_lists_the_matches() -> None:
    job = jobqueue.enqueue("test.add", {"a": 1, "b": 2})

    with pytest.raises(AssertionError) as failure:
        assert_not_enqueued("test.add")

    assert str(failure.value) == (
        "Expected no job 'test.add' in the queue, found 1.\n"
        f"Matching jobs (1):\n  #{job.pk} 'test.add' args={{'a': 1, 'b': 2}} queue='default' "
        "state=ready"
    )


def test_assertions_refuse_what_names_no_handler() -> None:
    with pytest.raises(TypeError, match="not a handler key"):
        assert_enqueued(print)
    with pytest.raises(TypeError, match="kwargs= is for Django tasks"):
        assert_enqueued("test.add", kwargs={"a": 1})


def test_capture_enqueued_sees_only_the_jobs_of_its_block() -> None:
    before = jobqueue.enqueue("test.noop")
    with capture_enqueued() as captured:
        inside = jobqueue.enqueue("test.add", {"a": 1, "b": 2})
        with jobqueue.container("box") as box:
            child = jobqueue.enqueue("test.noop", parent=box)
    after = jobqueue.enqueue("test.add", {"a": 5, "b": 5})

    assert isinstance(captured, CapturedJobs)
    assert [job.pk for job in captured] == [inside.pk, box.pk, child.pk]
    assert len(captured) == 3 and captured[0] == inside
    captured.assert_enqueued("test.add", {"a": 1, "b": 2}, count=1)
    captured.assert_enqueued("test.noop", parent=box)
    captured.assert_not_enqueued("test.add", {"a": 5, "b": 5})
    with pytest.raises(AssertionError, match=r"in the block, found 1\.\nMatching jobs \(1\):\n"):
        captured.assert_not_enqueued("test.noop")
    assert before.pk < inside.pk and after.pk not in [job.pk for job in captured]


# -- the fixture and the unittest runner -------------------------------------------------


def test_the_job_queue_fixture(job_queue: JobQueueFixture) -> None:
    a = jobqueue.enqueue("test.add", {"a": 1, "b": 2})
    jobqueue.enqueue("helpers.count_orders", depends_on=[a])
    with job_queue.capture() as captured:
        jobqueue.enqueue("test.noop")

    job_queue.assert_enqueued("test.add", {"a": 1, "b": 2})
    job_queue.assert_not_enqueued("test.add", {"a": 9, "b": 9})
    captured.assert_enqueued("test.noop", count=1)
    report = job_queue.run()

    assert report.counts == {"done": 3}
    assert job_queue.jobs("test.add", state="done") == [a]
    assert job_queue.assert_enqueued("helpers.count_orders", state="done")[0].result == 0


@pytest.mark.django_db(transaction=True)
def test_the_fixture_in_a_transactional_test(job_queue: JobQueueFixture) -> None:
    assert not connection.in_atomic_block
    jobqueue.enqueue("test.add", {"a": 1, "b": 1})
    assert job_queue.run().counts == {"done": 1}


def test_the_fixture_with_a_runaway(job_queue: JobQueueFixture) -> None:
    jobqueue.enqueue("helpers.forever")
    with pytest.raises(RunawayJobsError):
        job_queue.run(max_runs=3)


@pytest.mark.slow
def test_the_plugin_in_a_project_conftest(tmp_path: Any) -> None:
    """A project enables the plugin in its conftest.py and uses the fixture (a fresh pytest)."""
    (tmp_path / "conftest.py").write_text(
        'pytest_plugins = ["django_jobqueue.testing.pytest_plugin"]\n'
    )
    (tmp_path / "test_project.py").write_text(
        "import django_jobqueue as jobqueue\n\n"
        "def test_it(job_queue):\n"
        "    jobqueue.enqueue('test.add', {'a': 20, 'b': 22})\n"
        "    assert job_queue.run().jobs[0].result == 42\n"
        "    job_queue.assert_enqueued('test.add', {'a': 20, 'b': 22}, state='done')\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        # An SQLite database of its own, whatever this run's database is: the plugin does not
        # depend on it, and the same run id would recreate this run's test database.
        "DATABASE_URL": "",
        "JOBQUEUE_TEST_STATE": str(tmp_path),
        "JOBQUEUE_TEST_RUN_ID": "plugin",
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--create-db",
         str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_importing_the_helpers_needs_no_pytest() -> None:
    code = (
        "import sys; sys.modules['pytest'] = None\n"
        "import django; django.setup()\n"
        "import django_jobqueue.testing as t\n"
        "print(t.run_jobs.__name__, t.assert_enqueued.__name__, t.capture_enqueued.__name__)\n"
        "try:\n"
        "    import django_jobqueue.testing.pytest_plugin\n"
        "except ImportError:\n"
        "    print('plugin needs pytest')\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == [
        "run_jobs assert_enqueued capture_enqueued",
        "plugin needs pytest",
    ]


class UnittestRunnerTests(TestCase):
    """The helpers are plain functions: a Django TestCase uses them as they are."""

    def test_run_and_assert(self) -> None:
        a = jobqueue.enqueue("test.add", {"a": 1, "b": 2})
        jobqueue.enqueue("test.add", {"a": 3, "b": 4}, depends_on=[a])

        report = run_jobs()

        self.assertEqual(report.counts, {"done": 2})
        assert_enqueued("test.add", {"a": 3, "b": 4}, state="done")
        with self.assertRaises(AssertionError):
            assert_not_enqueued("test.add")


# -- Django Tasks ----------------------------------------------------------------------------


@requires_tasks
def test_tasks_run_and_their_results_refresh() -> None:
    first = tasks.add.enqueue(2, 3)
    second = tasks.add.using(depends_on=[first]).enqueue(a=10, b=20)
    mail = tasks.send_email.enqueue(to="ada@example.com")
    assert_enqueued(tasks.add, args=[2, 3])
    assert_enqueued(tasks.add, kwargs={"a": 10, "b": 20}, depends_on=first)
    assert_enqueued(tasks.add, depends_on=[int(first.id)], count=1)
    assert_enqueued(tasks.send_email, kwargs={"to": "ada@example.com"}, queue="emails")
    assert_not_enqueued(tasks.add, args=(2, 4))
    assert first.status == TaskResultStatus.READY

    report = run_jobs()

    assert [str(job.pk) for job in report.jobs] == [mail.id, first.id, second.id]  # priority 10
    for result in (first, second, mail):
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
    assert (first.return_value, second.return_value) == (5, 30)
    assert mail.return_value == "sent to ada@example.com"


@requires_tasks
def test_task_retries_and_failures(slow_backoff: None) -> None:
    flaky = tasks.flaky.enqueue()  # TASKS' MAX_ATTEMPTS is 2
    broken = tasks.explode.enqueue()
    after = tasks.add.using(depends_on=[broken]).enqueue(1, 1)

    run_jobs()

    for result in (flaky, broken, after):
        result.refresh()
    assert flaky.status == TaskResultStatus.SUCCESSFUL
    assert flaky.return_value == {"attempt": 2, "attempts": 2}
    assert broken.status == TaskResultStatus.FAILED and broken.attempts == 2
    assert broken.errors[-1].exception_class_path == "builtins.ValueError"
    assert after.status == TaskResultStatus.FAILED  # cancelled with its upstream


@requires_tasks
def test_async_tasks_run() -> None:
    product = tasks.async_mul.enqueue(6, 7)
    failure = tasks.async_explode.using(max_attempts=1).enqueue()

    assert run_jobs().counts == {"done": 1, "dead": 1}

    product.refresh()
    failure.refresh()
    assert (product.status, product.return_value) == (TaskResultStatus.SUCCESSFUL, 42)
    assert failure.status == TaskResultStatus.FAILED
    assert failure.errors[-1].exception_class_path == "builtins.KeyError"


@requires_tasks
def test_assert_enqueued_checks_task_arguments() -> None:
    with pytest.raises(TypeError, match="positional arguments"):
        assert_enqueued(tasks.add, args={"a": 1})
    tasks.echo.enqueue(1, (2, 3), k="v")
    assert_enqueued(tasks.echo, args=[1, [2, 3]], kwargs={"k": "v"})
    assert_enqueued(tasks.echo, args=(1, (2, 3)))  # tuples compare as the lists they store


def test_async_handlers_run() -> None:
    job = jobqueue.enqueue("test.async_add", {"a": 2, "b": 40})
    assert run_jobs().jobs == [job]
    assert refreshed(job)[0].result == 42


def dt_hours(hours: float) -> Any:
    import datetime as dt

    return dt.timedelta(hours=hours)


def test_the_lazy_names_are_listed_and_unknown_names_refused():
    import django_jobqueue.testing as testing

    assert {"run_jobs", "assert_enqueued", "capture_enqueued", "RunReport"} <= set(dir(testing))
    with pytest.raises(AttributeError, match="no attribute 'run_job'"):
        testing.run_job  # noqa: B018


def test_a_result_whose_check_raises_fails_its_attempt() -> None:
    """A result that raises while the worker checks it fails the attempt like any error,
    instead of leaving the job `running` with nothing recorded."""
    from django_jobqueue import enqueue

    job = enqueue("test.unreadable_result", max_attempts=1)
    report = run_jobs()
    assert report.counts == {"dead": 1}
    final = refreshed(job)[0]
    assert final.state == Job.State.DEAD
    assert final.last_error["type"] == "builtins.RuntimeError"
