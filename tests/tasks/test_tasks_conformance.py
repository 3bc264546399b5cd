"""JobQueueBackend against what Django's Tasks framework documents (django.tasks, Django 6.0+).

Every task here runs on the real worker: in this process (`JobWorker(...).run()` in burst mode,
its handler threads on their own database connections, hence transaction=True tests), and in
one test in a `jobqueue_worker` subprocess. The expected validation messages are Django's own:
each bad task is also put through Django's BaseTaskBackend.validate_task and must fail the same
way.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("django.tasks")

from asgiref.sync import async_to_sync
from django.db import connection, transaction
from django.tasks import (
    Task,
    TaskContext,
    TaskResult,
    TaskResultStatus,
    default_task_backend,
    task,
    task_backends,
)
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.exceptions import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultMismatch,
)
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_jobqueue.backends import JobQueueBackend, JobQueueTask, task_key
from django_jobqueue.models import Job
from django_jobqueue.worker import JobWorker, WorkerOptions
from tests.conftest import assert_clean_log, in_new_thread, poll
from tests.testapp import tasks
from tests.testapp.models import RunRecord

WORKER_ID = "conformance-worker"


# -- helpers ----------------------------------------------------------------------------------


def run_burst(concurrency: int = 1) -> None:
    """Run one burst worker in this process: it exits once nothing is runnable."""
    worker = JobWorker(WorkerOptions(burst=True, concurrency=concurrency, worker_id=WORKER_ID))
    assert worker.run(install_signals=False) == 0


def run_until_finished(*results: TaskResult, concurrency: int = 1, timeout: float = 60) -> None:
    """Run burst workers until every result is finished (a retry waits out its backoff)."""

    def finished() -> bool:
        run_burst(concurrency)
        for result in results:
            result.refresh()
        return all(r.is_finished for r in results)

    poll(finished, timeout=timeout)


def aware(value: dt.datetime | None) -> bool:
    return value is not None and timezone.is_aware(value)


@dataclasses.dataclass(frozen=True)
class SignalCall:
    signal: str
    sender: type
    id: str
    status: TaskResultStatus
    attempts: int
    errors: int
    exc_type: type[BaseException] | None  # sys.exc_info()[0] inside the receiver
    stored_status: TaskResultStatus | None  # the status get_result() read inside the receiver


@pytest.fixture
def signal_log() -> Iterator[list[SignalCall]]:
    """Record every task_enqueued / task_started / task_finished the test causes."""
    log: list[SignalCall] = []
    lock = threading.Lock()

    def receiver_for(name: str) -> Callable[..., None]:
        def receiver(sender: type, task_result: TaskResult, **kwargs: Any) -> None:
            stored = None
            if name == "started":  # what the queue says while the task runs
                stored = task_backends[task_result.backend].get_result(task_result.id).status
            call = SignalCall(
                signal=name,
                sender=sender,
                id=task_result.id,
                status=task_result.status,
                attempts=task_result.attempts,
                errors=len(task_result.errors),
                exc_type=sys.exc_info()[0],
                stored_status=stored,
            )
            with lock:
                log.append(call)

        return receiver

    receivers = [
        (task_enqueued, receiver_for("enqueued")),
        (task_started, receiver_for("started")),
        (task_finished, receiver_for("finished")),
    ]
    for signal, receiver in receivers:
        signal.connect(receiver, weak=False)
    try:
        yield log
    finally:
        for signal, receiver in receivers:
            signal.disconnect(receiver)


def with_fields(task_obj: Task, **changes: Any) -> Task:
    """A copy of `task_obj` with `changes` set as they are, bypassing validation.

    Not copy.copy(): Task.__reduce__ rebuilds the task through __init__, which validates it
    and, on a backend built afresh (another test file's override_settings(TASKS=...)),
    registers the copy as the task's own; setting `func` on it afterwards made every later
    `tasks.add` job run (and read back) another function.
    """
    bad = object.__new__(type(task_obj))
    for field in dataclasses.fields(task_obj):
        object.__setattr__(bad, field.name, changes.get(field.name, getattr(task_obj, field.name)))
    return bad


def takes_ctx_not_context(ctx: TaskContext) -> None:
    """Module level, but its first argument is not named `context`."""


def takes_nothing() -> None:
    """Module level, with no argument at all."""


class Rollback(Exception):
    pass


# -- the backend itself -----------------------------------------------------------------------


def test_backend_flags():
    backend = task_backends["default"]
    assert isinstance(backend, JobQueueBackend)
    assert backend.task_class is JobQueueTask
    assert backend.supports_defer is True
    assert backend.supports_async_task is True
    assert backend.supports_get_result is True
    assert backend.supports_priority is True
    assert backend.queues == {"default", "emails"}
    assert backend.default_max_attempts == 2  # OPTIONS, as tests/settings.py sets them
    assert isinstance(tasks.add, JobQueueTask)


@pytest.mark.django_db
def test_constructing_the_backend_runs_no_query():
    with CaptureQueriesContext(connection) as queries:
        backend = JobQueueBackend(
            "x", {"QUEUES": ["a", "b"], "OPTIONS": {"max_attempts": 4, "TIMEOUT": 9}}
        )
    assert queries.captured_queries == []
    assert backend.alias == "x"
    assert backend.queues == {"a", "b"}
    assert (backend.default_max_attempts, backend.default_timeout) == (4, 9)


# -- validation: Django's rules, Django's messages ---------------------------------------------


def nested_function() -> Callable[..., Any]:
    def nested(a: int, b: int) -> int:
        return a + b

    return nested


NAIVE = dt.datetime(2030, 1, 1, 12, 0)  # naive on purpose

# name: (fields that make tasks.add invalid, the public way to ask for it, Django's message)
INVALID: dict[str, tuple[Callable[[], dict[str, Any]], Callable[[], Any], str]] = {
    "not module level": (
        lambda: {"func": nested_function()},
        lambda: task()(nested_function()),
        "Task function must be defined at a module level.",
    ),
    "context argument misnamed": (
        lambda: {"func": takes_ctx_not_context, "takes_context": True},
        lambda: task(takes_context=True)(takes_ctx_not_context),
        "Task takes context but does not have a first argument of 'context'.",
    ),
    "context argument missing": (
        lambda: {"func": takes_nothing, "takes_context": True},
        lambda: task(takes_context=True)(takes_nothing),
        "Task takes context but does not have a first argument of 'context'.",
    ),
    "priority too high": (
        lambda: {"priority": 101},
        lambda: tasks.add.using(priority=101),
        "priority must be a whole number between -100 and 100.",
    ),
    "priority too low": (
        lambda: {"priority": -101},
        lambda: tasks.add.using(priority=-101),
        "priority must be a whole number between -100 and 100.",
    ),
    "priority not whole": (
        lambda: {"priority": 1.5},
        lambda: tasks.add.using(priority=1.5),
        "priority must be a whole number between -100 and 100.",
    ),
    "priority in decorator": (
        lambda: {"priority": 200},
        lambda: task(priority=200)(takes_nothing),
        "priority must be a whole number between -100 and 100.",
    ),
    "naive run_after": (
        lambda: {"run_after": NAIVE},
        lambda: tasks.add.using(run_after=NAIVE),
        "run_after must be an aware datetime.",
    ),
    "queue not configured": (
        lambda: {"queue_name": "nope"},
        lambda: tasks.add.using(queue_name="nope"),
        "Queue 'nope' is not valid for backend.",
    ),
    "queue in decorator": (
        lambda: {"queue_name": "elsewhere"},
        lambda: task(queue_name="elsewhere")(takes_nothing),
        "Queue 'elsewhere' is not valid for backend.",
    ),
}


@pytest.mark.django_db
@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_tasks_fail_as_django_says_and_write_nothing(case):
    changes, public_way, message = INVALID[case]
    backend = task_backends["default"]
    bad = with_fields(tasks.add, **changes())

    # Django's own validate_task rejects it with this message ...
    with pytest.raises(InvalidTask) as django_error:
        BaseTaskBackend.validate_task(backend, bad)
    assert str(django_error.value) == message
    # ... and so does ours, whether asked directly, at definition/using(), or at enqueue.
    with pytest.raises(InvalidTask) as ours:
        backend.validate_task(bad)
    assert str(ours.value) == message
    with pytest.raises(InvalidTask) as defined:
        public_way()
    assert str(defined.value) == message
    with CaptureQueriesContext(connection) as queries, pytest.raises(InvalidTask) as enqueued:
        bad.enqueue(1, 2)
    assert str(enqueued.value) == message
    assert queries.captured_queries == []
    assert not Job.objects.exists()


def test_valid_tasks_pass_validation():
    backend = task_backends["default"]
    backend.validate_task(tasks.add)
    backend.validate_task(tasks.async_mul)  # supports_async_task
    backend.validate_task(tasks.attempt_number)  # takes_context with `context` first
    for priority in (-100, 0, 100):
        assert tasks.add.using(priority=priority).priority == priority
    later = timezone.now() + dt.timedelta(hours=1)
    assert tasks.add.using(run_after=later).run_after == later
    assert tasks.add.using(queue_name="emails").queue_name == "emails"


# -- enqueue: the caller's transaction ---------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_enqueue_writes_the_job_in_the_callers_transaction(signal_log):
    with pytest.raises(Rollback), transaction.atomic():
        rolled_back = tasks.add.enqueue(1, 2)
        assert Job.objects.filter(pk=rolled_back.id).exists()  # the writer sees it ...
        # ... no other connection (a worker) does before the commit.
        assert not in_new_thread(lambda: Job.objects.filter(pk=rolled_back.id).exists())
        raise Rollback
    assert not Job.objects.exists()
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result(rolled_back.id)
    with pytest.raises(TaskResultDoesNotExist):
        rolled_back.refresh()

    with transaction.atomic():
        kept = tasks.add.enqueue(3, 4)
    assert in_new_thread(lambda: Job.objects.filter(pk=kept.id).exists())
    job = Job.objects.get(pk=kept.id)
    assert job.type == task_key("default", "tests.testapp.tasks.add")
    assert job.args == {"args": [3, 4], "kwargs": {}}
    assert (job.state, job.queue, job.priority) == ("ready", "default", 0)
    assert tasks.add.get_result(kept.id).status == TaskResultStatus.READY

    enqueued = [c for c in signal_log if c.signal == "enqueued"]
    assert [c.id for c in enqueued] == [rolled_back.id, kept.id]
    assert all(c.sender is JobQueueBackend for c in enqueued)
    assert all(c.status == TaskResultStatus.READY for c in enqueued)


# -- the lifecycle ----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_successful_task_lifecycle(signal_log):
    before = timezone.now()
    result = tasks.add.enqueue(2, 3)
    assert isinstance(result, TaskResult)
    assert isinstance(result.id, str) and result.id
    assert result.task == tasks.add
    assert result.backend == "default"
    assert (result.args, result.kwargs) == ([2, 3], {})
    assert result.status == TaskResultStatus.READY
    assert not result.is_finished
    assert aware(result.enqueued_at) and before <= result.enqueued_at <= timezone.now()
    assert result.started_at is None and result.last_attempted_at is None
    assert result.finished_at is None
    assert (result.errors, result.worker_ids, result.attempts) == ([], [], 0)
    with pytest.raises(ValueError, match="Task has not finished yet"):
        _ = result.return_value

    run_until_finished(result)

    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.is_finished
    assert result.return_value == 5
    assert result.errors == []
    assert result.worker_ids == [WORKER_ID]
    assert result.attempts == 1 == len(result.worker_ids)
    assert all(
        aware(t)
        for t in (
            result.enqueued_at,
            result.started_at,
            result.last_attempted_at,
            result.finished_at,
        )
    )
    assert result.enqueued_at <= result.started_at <= result.last_attempted_at
    assert result.last_attempted_at <= result.finished_at <= timezone.now()
    # A fresh look-up says the same.
    fetched = tasks.add.get_result(result.id)
    assert (fetched.status, fetched.return_value, fetched.worker_ids) == (
        TaskResultStatus.SUCCESSFUL,
        5,
        [WORKER_ID],
    )

    started = [c for c in signal_log if c.signal == "started"]
    finished = [c for c in signal_log if c.signal == "finished"]
    assert [(c.id, c.status, c.stored_status, c.attempts) for c in started] == [
        (result.id, TaskResultStatus.RUNNING, TaskResultStatus.RUNNING, 1)
    ]
    assert [(c.id, c.status, c.exc_type, c.sender) for c in finished] == [
        (result.id, TaskResultStatus.SUCCESSFUL, None, JobQueueBackend)
    ]


@pytest.mark.django_db(transaction=True)
def test_task_sees_itself_running():
    result = tasks.inspect_self.enqueue()
    run_until_finished(result)
    seen = result.return_value
    assert seen["id"] == result.id
    assert seen["attempt"] == 1
    assert seen["context_status"] == TaskResultStatus.RUNNING
    assert seen["stored_status"] == TaskResultStatus.RUNNING  # the queue says so too
    assert seen["stored_worker_ids"] == [WORKER_ID]
    assert seen["started_at_set"] and not seen["finished_at_set"]


@pytest.mark.django_db(transaction=True)
def test_returning_none_is_a_success_with_return_value_none():
    result = tasks.returns_none.enqueue()
    run_until_finished(result)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value is None


@pytest.mark.django_db(transaction=True)
def test_arguments_and_return_value_are_json_normalised():
    result = tasks.echo.enqueue(1, (2, 3), "x", flag=True, nested={"k": (None, 1.5)})
    assert result.args == [1, [2, 3], "x"]
    assert result.kwargs == {"flag": True, "nested": {"k": [None, 1.5]}}
    run_until_finished(result)
    assert result.return_value == {
        "args": [1, [2, 3], "x"],
        "kwargs": {"flag": True, "nested": {"k": [None, 1.5]}},
    }


@pytest.mark.django_db(transaction=True)
def test_failed_task_records_one_error_per_attempt(signal_log):
    result = tasks.explode.enqueue()  # OPTIONS MAX_ATTEMPTS 2: two attempts, two errors
    run_until_finished(result)

    assert result.status == TaskResultStatus.FAILED
    assert result.is_finished
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value
    assert len(result.errors) == 2
    for error in result.errors:
        assert error.exception_class_path == "builtins.ValueError"
        assert error.exception_class is ValueError
        assert 'raise ValueError("exploded")' in error.traceback
        assert "ValueError: exploded" in error.traceback
    assert result.worker_ids == [WORKER_ID, WORKER_ID]
    assert result.attempts == 2 == len(result.worker_ids)
    assert result.enqueued_at <= result.started_at <= result.finished_at

    finished = [c for c in signal_log if c.signal == "finished"]
    assert [(c.status, c.exc_type, c.attempts, c.errors) for c in finished] == [
        (TaskResultStatus.FAILED, ValueError, 1, 1),
        (TaskResultStatus.FAILED, ValueError, 2, 2),
    ]
    started = [c for c in signal_log if c.signal == "started"]
    assert [(c.status, c.attempts, c.errors) for c in started] == [
        (TaskResultStatus.RUNNING, 1, 0),
        (TaskResultStatus.RUNNING, 2, 1),
    ]


@pytest.mark.django_db(transaction=True)
def test_context_attempt_starts_at_one_and_counts_retries():
    first = tasks.attempt_number.enqueue()
    retried = tasks.flaky.enqueue()
    run_until_finished(first, retried)

    assert first.return_value == 1
    assert retried.status == TaskResultStatus.SUCCESSFUL
    assert retried.return_value == {"attempt": 2, "attempts": 2}
    assert list(
        RunRecord.objects.filter(job_id=int(retried.id))
        .order_by("pk")
        .values_list("attempt", flat=True)
    ) == [1, 2]
    assert [e.exception_class for e in retried.errors] == [RuntimeError]
    assert "first attempt fails" in retried.errors[0].traceback
    assert retried.attempts == 2 == len(retried.worker_ids)


# -- priorities, deferral, async --------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_higher_priority_runs_first():
    low = tasks.record_run.using(priority=-10).enqueue("low")
    mid = tasks.record_run.enqueue("mid")
    high = tasks.record_run.using(priority=50).enqueue("high")
    top = tasks.record_run.using(priority=100).enqueue("top")
    run_until_finished(low, mid, high, top, concurrency=1)
    order = list(RunRecord.objects.order_by("pk").values_list("job_id", flat=True))
    assert order == [int(r.id) for r in (top, high, mid, low)]
    # A result read back names the task as it was enqueued, with its priority.
    fetched = [tasks.record_run.get_result(r.id).task.priority for r in (top, high, mid, low)]
    assert fetched == [100, 50, 0, -10]
    assert list(Job.objects.order_by("-priority").values_list("priority", flat=True)) == [
        100,
        50,
        0,
        -10,
    ]


@pytest.mark.django_db(transaction=True)
def test_decorator_queue_and_priority_are_stored():
    result = tasks.send_email.enqueue("ann@example.com")
    job = Job.objects.get(pk=result.id)
    assert (job.queue, job.priority) == ("emails", 10)
    assert (result.task.queue_name, result.task.priority) == ("emails", 10)
    run_until_finished(result)
    assert result.return_value == "sent to ann@example.com"


@pytest.mark.django_db(transaction=True)
def test_run_after_in_the_future_is_not_run_before_it():
    when = timezone.now() + dt.timedelta(seconds=2)
    result = tasks.add.using(run_after=when).enqueue(1, 1)
    assert result.task.run_after == when
    assert Job.objects.get(pk=result.id).run_after == when

    run_burst()  # nothing is runnable yet: the burst worker exits at once
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert result.started_at is None and result.worker_ids == []

    poll(lambda: timezone.now() > when + dt.timedelta(milliseconds=100), timeout=30)
    run_until_finished(result)
    assert result.return_value == 2
    assert result.started_at >= when


@pytest.mark.django_db(transaction=True)
def test_run_after_timedelta_becomes_an_aware_datetime():
    delay = dt.timedelta(seconds=30)
    deferred = tasks.add.using(run_after=delay)
    assert deferred.run_after == delay  # accepted by validation as it is

    before = timezone.now()
    result = deferred.enqueue(2, 2)
    after = timezone.now()
    job = Job.objects.get(pk=result.id)
    assert aware(job.run_after)
    assert before + delay <= job.run_after <= after + delay
    # The result's task says when it runs, as an aware datetime, like a get_result() does.
    assert isinstance(result.task.run_after, dt.datetime) and aware(result.task.run_after)
    assert result.task.run_after == job.run_after
    assert tasks.add.get_result(result.id).task.run_after == job.run_after

    run_burst()
    result.refresh()
    assert result.status == TaskResultStatus.READY and result.worker_ids == []


@pytest.mark.django_db(transaction=True)
def test_async_tasks_run():
    good = tasks.async_mul.enqueue(4, 5)
    bad = tasks.async_explode.using(max_attempts=1).enqueue()
    run_until_finished(good, bad)
    assert good.status == TaskResultStatus.SUCCESSFUL and good.return_value == 20
    assert bad.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in bad.errors] == [KeyError]
    assert "async exploded" in bad.errors[0].traceback


# -- results: refresh, get_result and their async twins, aenqueue -------------------------------


@pytest.mark.django_db(transaction=True)
def test_refresh_and_arefresh_update_a_result():
    result = tasks.add.enqueue(2, 2)
    other_copy = tasks.add.get_result(result.id)
    async_to_sync(other_copy.arefresh)()
    assert other_copy.status == TaskResultStatus.READY

    run_burst()
    assert result.status == TaskResultStatus.READY  # a TaskResult is a snapshot ...
    result.refresh()  # ... until refreshed
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 4
    async_to_sync(other_copy.arefresh)()
    assert other_copy.status == TaskResultStatus.SUCCESSFUL and other_copy.return_value == 4
    assert other_copy.finished_at == result.finished_at
    assert other_copy.worker_ids == result.worker_ids == [WORKER_ID]


@pytest.mark.django_db(transaction=True)
def test_get_result_and_aget_result():
    result = tasks.add.enqueue(5, 5)
    run_until_finished(result)
    for fetched in (
        tasks.add.get_result(result.id),
        async_to_sync(tasks.add.aget_result)(result.id),
        default_task_backend.get_result(result.id),
        async_to_sync(default_task_backend.aget_result)(result.id),
    ):
        assert fetched.id == result.id
        assert fetched.task.func is tasks.add.func
        assert fetched.status == TaskResultStatus.SUCCESSFUL
        assert fetched.return_value == 10
        assert (fetched.args, fetched.kwargs) == ([5, 5], {})


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("unknown", ["0", "999999999", "99999999999999999999999", "abc", ""])
def test_unknown_result_id_does_not_exist(unknown):
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result(unknown)
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(unknown)
    with pytest.raises(TaskResultDoesNotExist):
        async_to_sync(tasks.add.aget_result)(unknown)


@pytest.mark.django_db(transaction=True)
def test_get_result_of_another_task_is_a_mismatch():
    result = tasks.add.enqueue(1, 1)
    with pytest.raises(TaskResultMismatch):
        tasks.explode.get_result(result.id)
    with pytest.raises(TaskResultMismatch):
        async_to_sync(tasks.explode.aget_result)(result.id)
    assert tasks.add.get_result(result.id).id == result.id


@pytest.mark.django_db(transaction=True)
def test_aenqueue(signal_log):
    result = async_to_sync(tasks.add.aenqueue)(6, 7)
    async_result = async_to_sync(tasks.async_mul.aenqueue)(6, 7)
    assert result.status == TaskResultStatus.READY
    assert Job.objects.filter(pk__in=[result.id, async_result.id]).count() == 2
    assert [c.id for c in signal_log if c.signal == "enqueued"] == [result.id, async_result.id]
    run_until_finished(result, async_result)
    assert (result.return_value, async_result.return_value) == (13, 42)


# -- a real worker process --------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_tasks_run_in_a_jobqueue_worker_process(start_worker):
    """The worker process finds the tasks itself (apps.py autodiscovers tasks.py) and runs them."""
    added = tasks.add.enqueue(20, 22)
    multiplied = tasks.async_mul.enqueue(6, 7)
    inspected = tasks.inspect_self.enqueue()
    failed = tasks.explode.using(max_attempts=1).enqueue()
    worker = start_worker("--burst", "--concurrency", "2")
    assert worker.wait() == 0, worker.output()
    for result in (added, multiplied, inspected, failed):
        result.refresh()

    assert added.return_value == 42
    assert multiplied.return_value == 42
    seen = inspected.return_value
    assert seen["pid"] == worker.pid
    assert seen["stored_status"] == TaskResultStatus.RUNNING
    assert failed.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in failed.errors] == [ValueError]
    for result in (added, multiplied, inspected, failed):
        assert len(result.worker_ids) == 1 == result.attempts
        host, pid, _ = result.worker_ids[0].split(":")
        assert (host, int(pid)) == (socket.gethostname(), worker.pid)
    assert_clean_log(worker.output())
