"""JobQueueBackend beyond Django's contract: the queue's own options through JobQueueTask.using(),
the exception classes results name, the allowlist the worker enforces, and what must also hold
on Django 5.2 (no django.tasks): `django_jobqueue.backends` imports and defines nothing.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import django
import pytest
from django.test import override_settings

from django_jobqueue import backends, exceptions
from django_jobqueue.models import Job, JobStep
from django_jobqueue.worker import JobWorker, WorkerOptions
from tests.conftest import ROOT, assert_clean_log, in_new_thread, poll
from tests.support.markers import requires_task_options, requires_tasks

HAS_TASKS = django.VERSION >= (6, 0)

if HAS_TASKS:
    from django.tasks import TaskResultStatus, task_backends
    from django.tasks.base import TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist

    from tests.testapp import tasks


WORKER_ID = "extras-worker"

OUR_BACKEND = "django_jobqueue.backends.JobQueueBackend"


def run_burst(concurrency: int = 1) -> None:
    worker = JobWorker(WorkerOptions(burst=True, concurrency=concurrency, worker_id=WORKER_ID))
    assert worker.run(install_signals=False) == 0


def run_until_finished(*results: Any, timeout: float = 60) -> None:
    def finished() -> bool:
        run_burst()
        for result in results:
            result.refresh()
        return all(r.is_finished for r in results)

    poll(finished, timeout=timeout)


def run_until_terminal(*pks: Any, timeout: float = 60) -> list[Job]:
    def terminal() -> list[Job] | None:
        run_burst()
        jobs = [Job.objects.get(pk=pk) for pk in pks]
        return jobs if all(j.is_terminal for j in jobs) else None

    return poll(terminal, timeout=timeout)


def two_aliases(**other: Any) -> dict[str, Any]:
    """TASKS with the tests' default alias and a second alias on our backend."""
    return {
        "default": {
            "BACKEND": OUR_BACKEND,
            "QUEUES": ["default", "emails"],
            "OPTIONS": {"MAX_ATTEMPTS": 2},
        },
        "other": {"BACKEND": OUR_BACKEND, "QUEUES": ["default"], **other},
    }


# -- on every Django version ------------------------------------------------------------------


def test_backends_module_imports_on_every_django_version():
    assert backends.HAS_TASKS is HAS_TASKS
    assert hasattr(backends, "JobQueueBackend") is HAS_TASKS
    assert hasattr(backends, "JobQueueTask") is HAS_TASKS
    assert backends.task_key("default", "app.tasks.f") == "task:default:app.tasks.f"


PROBE = """
import json, sys
import django
import django_jobqueue.backends as b
report = {"has_tasks": b.HAS_TASKS}
if b.HAS_TASKS:
    from django.tasks import task
    backend = b.JobQueueBackend("probe", {"QUEUES": ["default"], "OPTIONS": {"MAX_ATTEMPTS": 3}})
    report["max_attempts"] = backend.default_max_attempts

    def defined_here(a):
        return a

    # Defining a task at import time (as tasks.py modules do) validates and allowlists it.
    report["task"] = task()(defined_here).module_path
report["models_imported"] = sorted(
    m for m in sys.modules if m.endswith(".models") and m.startswith(("django_jobqueue", "tests"))
)
from django.apps import apps
report["apps_ready"] = apps.ready
print(json.dumps(report))
"""


def test_backend_import_construction_and_task_definition_need_no_models():
    """In a fresh interpreter without django.setup(): nothing here may need the app registry."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["has_tasks"] is HAS_TASKS
    assert report["models_imported"] == []
    assert report["apps_ready"] is False
    if HAS_TASKS:
        assert report["max_attempts"] == 3
        assert report["task"] == "__main__.defined_here"


# -- JobQueueTask.using(): the queue's own options ----------------------------------------------


@requires_tasks
def test_using_keeps_djangos_options_and_adds_ours():
    changed = tasks.add.using(
        priority=7,
        queue_name="emails",
        group="g",
        weight=2,
        unique_key="k",
        max_attempts=5,
        timeout=dt.timedelta(seconds=3),
    )
    assert isinstance(changed, backends.JobQueueTask)
    assert (changed.priority, changed.queue_name, changed.backend) == (7, "emails", "default")
    assert (changed.group, changed.weight, changed.unique_key) == ("g", 2, "k")
    assert (changed.max_attempts, changed.timeout) == (5, dt.timedelta(seconds=3))
    assert changed.func is tasks.add.func
    # The original is untouched (Tasks are immutable).
    assert (tasks.add.priority, tasks.add.group, tasks.add.max_attempts) == (0, "", None)


@requires_tasks
@pytest.mark.django_db(transaction=True)
def test_depends_on_a_task_result_runs_after_it():
    first = tasks.record_run.enqueue("first")
    second = tasks.record_run.using(depends_on=[first]).enqueue("second")
    assert second.status == TaskResultStatus.READY  # waiting on `first` still reads READY
    assert Job.objects.get(pk=second.id).state == "waiting"
    run_until_finished(first, second)
    assert (first.return_value, second.return_value) == ("first", "second")
    assert second.started_at >= first.finished_at


@requires_tasks
@pytest.mark.django_db(transaction=True)
def test_a_failed_upstream_fails_the_downstream_task_with_upstream_failed():
    upstream = tasks.explode.using(max_attempts=1).enqueue()
    downstream = tasks.add.using(depends_on=[upstream]).enqueue(1, 2)
    run_until_finished(upstream, downstream)
    assert downstream.status == TaskResultStatus.FAILED
    assert downstream.worker_ids == []  # it never ran
    assert [e.exception_class for e in downstream.errors] == [exceptions.UpstreamFailed]


@requires_tasks
@pytest.mark.django_db(transaction=True)
def test_a_task_that_takes_its_context_makes_durable_calls_through_it():
    """A `takes_context=True` task steps, records progress, sleeps, waits for an event,
    spawns a child and waits for it, through its context; suspended, it holds no lease and
    uses no attempt."""
    import django_jobqueue as jobqueue

    result = tasks.durable_report.using(max_attempts=1).enqueue("report:7")
    poll(lambda: run_burst() or Job.objects.get(pk=result.id).state == "waiting", timeout=60)
    row = Job.objects.get(pk=result.id)
    assert (row.lease_owner, row.attempts) == (None, 0)
    assert row.progress["current"] == 1 and row.progress["message"] == "slept"
    jobqueue.send_event("report:7", {"ok": True})
    run_until_finished(result)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"first": 1, "payload": {"ok": True}, "child": 9}
    row = Job.objects.get(pk=result.id)
    assert row.attempts == 1 and row.progress["current"] == 3


@requires_tasks
@pytest.mark.django_db(transaction=True)
def test_an_async_task_that_takes_its_context_awaits_its_durable_calls():
    """The same as above for an `async def` task: each durable call of its context is
    awaited, with the same records and suspensions."""
    import django_jobqueue as jobqueue

    result = tasks.adurable_report.using(max_attempts=1).enqueue("report:8")
    poll(lambda: run_burst() or Job.objects.get(pk=result.id).state == "waiting", timeout=60)
    row = Job.objects.get(pk=result.id)
    assert (row.lease_owner, row.attempts) == (None, 0)
    assert row.progress["current"] == 1 and row.progress["message"] == "slept"
    jobqueue.send_event("report:8", {"ok": True})
    run_until_finished(result)
    assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
    assert result.return_value == {"first": 1, "payload": {"ok": True}, "child": 9}
    row = Job.objects.get(pk=result.id)
    assert row.attempts == 1 and row.progress["current"] == 3
    names = sorted(JobStep.objects.filter(job_id=row.pk).values_list("name", flat=True))
    assert names == ["@event", "@sleep", "@spawn", "@wait", "first"]


@requires_tasks
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", ["race_report", "arace_report"])
def test_a_task_waits_for_the_first_of_many_through_its_context(name):
    """wait_for_any (with cancel_rest) and wait_for(count=) through a task's context, sync
    and async: each returns the first child's result, and the other child of the first pair
    is cancelled. (A burst worker claims the two children of a pair together: which one
    ends first is the worker's call.)"""
    result = getattr(tasks, name).using(max_attempts=1).enqueue()
    run_until_finished(result)
    assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
    value = result.return_value
    assert len(value["any"]) >= 1 and set(value["any"]) <= {1, 4}
    assert len(value["count"]) >= 1 and set(value["count"]) <= {9, 16}
    children = Job.objects.filter(parent_id=result.id).order_by("pk")
    assert children.count() == 4
    states = list(children.values_list("state", flat=True))
    assert states[2:] == ["done", "done"]
    assert sorted(states[:2]) in (["cancelled", "done"], ["done", "done"])


@requires_tasks
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", ["map_report", "amap_report"])
def test_a_task_maps_over_items_through_its_context(name):
    result = getattr(tasks, name).using(max_attempts=1).enqueue()
    run_until_finished(result)
    assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
    assert result.return_value == [1, 4, 9]
    assert Job.objects.filter(parent_id=result.id).count() == 3


@requires_tasks
@pytest.mark.django_db(transaction=True)
def test_group_and_weight_are_stored_and_the_task_runs():
    result = tasks.add.using(group="tenant-a", weight=3).enqueue(1, 2)
    job = Job.objects.get(pk=result.id)
    assert (job.group_key, job.weight) == ("tenant-a", 3)
    run_until_finished(result)
    assert result.return_value == 3


@requires_tasks
@pytest.mark.django_db
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"weight": 0}, "weight must be at least 1."),
        ({"max_attempts": 0}, "max_attempts must be at least 1."),
        ({"timeout": 0}, "timeout must be positive."),
        ({"timeout": dt.timedelta(0)}, "timeout must be positive."),
    ],
)
def test_invalid_queue_options_are_invalid_tasks(options, message):
    with pytest.raises(InvalidTask, match=message):
        tasks.add.using(**options)
    assert not Job.objects.exists()


@requires_tasks
@pytest.mark.django_db(transaction=True)
def test_unique_key_returns_the_unfinished_job():
    first = tasks.add.using(unique_key="nightly").enqueue(1, 1)
    again = tasks.add.using(unique_key="nightly").enqueue(1, 1)
    assert again.id == first.id
    assert Job.objects.count() == 1
    run_until_finished(first)
    later = tasks.add.using(unique_key="nightly").enqueue(1, 1)
    assert later.id != first.id  # the key is free once its job finished


@requires_tasks
@pytest.mark.django_db(transaction=True)
def test_max_attempts_overrides_the_backend_option():
    once = tasks.explode.using(max_attempts=1).enqueue()
    thrice = tasks.explode.using(max_attempts=3).enqueue()
    default = tasks.explode.enqueue()  # OPTIONS MAX_ATTEMPTS 2
    run_until_finished(once, thrice, default)
    assert [len(r.errors) for r in (once, thrice, default)] == [1, 3, 2]
    assert [r.attempts for r in (once, thrice, default)] == [1, 3, 2]
    assert all(r.status == TaskResultStatus.FAILED for r in (once, thrice, default))


@requires_tasks
@pytest.mark.django_db(transaction=True)
def test_timeout_fails_the_task_with_job_timeout():
    result = tasks.sleepy.using(timeout=0.3, max_attempts=1).enqueue(10)
    run_until_finished(result)
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in result.errors] == [exceptions.JobTimeout]
    assert Job.objects.get(pk=result.id).timeout == 0.3


@requires_tasks
@pytest.mark.django_db(transaction=True)
def test_backend_options_are_the_defaults_of_its_jobs():
    tasks_setting = {
        "default": {
            "BACKEND": OUR_BACKEND,
            "QUEUES": ["default", "emails"],
            "OPTIONS": {"MAX_ATTEMPTS": 1, "TIMEOUT": 5, "GROUP": "reports"},
        }
    }
    with override_settings(TASKS=tasks_setting):
        plain = tasks.add.enqueue(1, 1)
        explicit = tasks.add.using(max_attempts=4, timeout=2, group="mine").enqueue(1, 1)
    rows = {j.pk: j for j in Job.objects.all()}
    assert (rows[int(plain.id)].max_attempts, rows[int(plain.id)].timeout) == (1, 5)
    assert rows[int(plain.id)].group_key == "reports"
    assert (rows[int(explicit.id)].max_attempts, rows[int(explicit.id)].timeout) == (4, 2)
    assert rows[int(explicit.id)].group_key == "mine"


@requires_tasks
@pytest.mark.django_db
def test_whole_number_priority_is_accepted_like_django_does():
    result = tasks.add.using(priority=5.0).enqueue(1, 1)
    assert Job.objects.get(pk=result.id).priority == 5


@requires_tasks
@pytest.mark.django_db
def test_arguments_that_are_not_json_are_invalid_and_write_nothing():
    with pytest.raises(InvalidTask, match="JSON-serializable"):
        tasks.echo.enqueue(object())
    with pytest.raises(InvalidTask, match="JSON-serializable"):
        tasks.echo.enqueue(value=float("nan"))
    assert not Job.objects.exists()


@requires_tasks
@pytest.mark.django_db(transaction=True)
def test_a_cancelled_task_is_failed():
    import django_jobqueue as jobqueue

    result = tasks.add.enqueue(1, 1)
    assert jobqueue.cancel(int(result.id)) is True
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.is_finished and result.finished_at is not None
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value
    run_burst()
    result.refresh()
    assert result.worker_ids == []  # never ran


@requires_tasks
@requires_task_options("@task(**kwargs) is Django 6.1+")
@pytest.mark.django_db(transaction=True)
def test_queue_options_in_the_task_decorator():
    assert (tasks.grouped_report.group, tasks.grouped_report.max_attempts) == ("reports", 1)
    result = tasks.grouped_report.enqueue("q3")
    job = Job.objects.get(pk=result.id)
    assert (job.group_key, job.max_attempts) == ("reports", 1)
    run_until_finished(result)
    assert result.return_value == "report q3"


# -- what results name --------------------------------------------------------------------------

RECORDED = ["JobTimeout", "LeaseExpired", "LeaseLost", "UpstreamFailed", "JobCancelled",
            "UnknownHandlerError", "Fail"]  # fmt: skip


@requires_tasks
@pytest.mark.parametrize("name", RECORDED)
def test_every_recorded_exception_class_is_importable(name):
    error = TaskError(exception_class_path=f"django_jobqueue.exceptions.{name}", traceback="")
    assert error.exception_class is getattr(exceptions, name)
    assert issubclass(error.exception_class, BaseException)


@requires_tasks
@pytest.mark.django_db
def test_results_read_every_recorded_error_back():
    errors = [
        {
            "type": f"django_jobqueue.exceptions.{name}",
            "message": name,
            "traceback": "",
            "attempt": 1,
        }
        for name in RECORDED
    ]
    job = Job.objects.create(
        type=backends.task_key("default", "tests.testapp.tasks.add"),
        args={"args": [1, 2], "kwargs": {}},
        state=Job.State.DEAD,
        attempts=len(RECORDED),
        errors=errors,
        last_error=errors[-1],
        finished_at=dt.datetime.now(dt.UTC),
        unique_slot=None,
    )
    result = tasks.add.get_result(str(job.pk))
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in result.errors] == [
        getattr(exceptions, name) for name in RECORDED
    ]


# -- the allowlist ------------------------------------------------------------------------------


@requires_tasks
@pytest.mark.django_db(transaction=True)
def test_worker_runs_only_tasks_that_were_defined(tmp_path: Path):
    marker = tmp_path / "ran"
    evil = Job.objects.create(
        type=backends.task_key("default", "os.system"),
        args={"args": [f"touch {marker}"], "kwargs": {}},
    )
    unlisted = Job.objects.create(
        type=backends.task_key("default", "tests.unlisted_tasks.side_effect"),
        args={"args": [], "kwargs": {}},
    )
    assert "tests.unlisted_tasks" not in sys.modules
    run_burst()
    # Never claimed: a worker claims only the types it has handlers for, and leaves the rest
    # ready for a worker that has them (a newer release, in a rolling deploy).
    for job in Job.objects.filter(pk__in=[evil.pk, unlisted.pk]):
        assert (job.state, job.attempts, job.result) == (Job.State.READY, 0, None)
    assert not marker.exists()
    assert "tests.unlisted_tasks" not in sys.modules  # the worker imported nothing
    # os.system is no task: there is no result to read either.
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(str(evil.pk))


@requires_tasks
@pytest.mark.django_db(transaction=True)
def test_get_result_of_a_job_that_is_no_task_does_not_exist():
    import django_jobqueue as jobqueue

    job = jobqueue.enqueue("test.add", {"a": 1, "b": 2})
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result(str(job.pk))


# -- several aliases on our backend ---------------------------------------------------------------


@requires_tasks
@pytest.mark.django_db(transaction=True)
def test_results_belong_to_the_alias_that_enqueued_them():
    with override_settings(TASKS=two_aliases()):
        result = tasks.add.using(backend="other").enqueue(2, 3)
        assert result.backend == "other"
        assert Job.objects.get(pk=result.id).type == "task:other:tests.testapp.tasks.add"
        with pytest.raises(TaskResultDoesNotExist):
            task_backends["default"].get_result(result.id)
        assert task_backends["other"].get_result(result.id).backend == "other"
        # Another thread has its own backend instances, which never saw this task enqueued.
        fetched = in_new_thread(lambda: task_backends["other"].get_result(result.id))
        assert (fetched.id, fetched.backend, fetched.task.backend) == (result.id, "other", "other")
        run_until_finished(result)
        assert result.return_value == 5


@requires_tasks
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_process_runs_tasks_enqueued_on_another_alias(start_worker):
    """The worker process imports tasks.py, whose tasks are defined for the default alias; a
    task enqueued with using(backend="other") must be allowlisted on "other" too."""
    setting = two_aliases()
    with override_settings(TASKS=setting):
        result = tasks.add.using(backend="other").enqueue(2, 3)
        worker = start_worker("--burst", env={"JOBQUEUE_TEST_TASKS": json.dumps(setting)})
        assert worker.wait() == 0, worker.output()
        result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
    assert result.return_value == 5
    assert_clean_log(worker.output())


@requires_tasks
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_subclass_of_our_backend_gets_its_tasks_discovered(start_worker):
    setting = {
        "default": {
            "BACKEND": "tests.testapp.task_backends.SubclassedBackend",
            "QUEUES": ["default", "emails"],
        }
    }
    with override_settings(TASKS=setting):
        result = tasks.add.enqueue(20, 22)
        worker = start_worker("--burst", env={"JOBQUEUE_TEST_TASKS": json.dumps(setting)})
        assert worker.wait() == 0, worker.output()
        result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
    assert result.return_value == 42
    assert_clean_log(worker.output())


@requires_tasks
def test_apps_recognise_our_backend_and_its_subclasses_only():
    from django_jobqueue.apps import _uses_our_tasks_backend

    for path, ours in [
        (OUR_BACKEND, True),
        ("tests.testapp.task_backends.SubclassedBackend", True),
        ("django.tasks.backends.immediate.ImmediateBackend", False),
        ("no.such.Backend", False),
    ]:
        with override_settings(TASKS={"default": {"BACKEND": path}}):
            assert _uses_our_tasks_backend() is ours, path


# -- the django_tasks backport ----------------------------------------------------------------


@requires_tasks
@pytest.mark.django_db
def test_arguments_that_are_not_json_raise_a_type_error_as_django_documents():
    with pytest.raises(TypeError, match="JSON-serializable") as raised:
        tasks.echo.enqueue(object())
    assert isinstance(raised.value, InvalidTask)
    assert isinstance(raised.value, backends.InvalidTaskArguments)
    assert not Job.objects.exists()


@requires_tasks
@pytest.mark.django_db(transaction=True)
def test_started_at_is_the_first_attempts_start_and_last_attempted_at_the_latest():
    result = tasks.flaky.enqueue()
    run_until_finished(result)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.attempts == 2
    job = Job.objects.get(pk=result.id)
    assert result.started_at == job.first_started_at
    assert result.last_attempted_at == job.started_at
    assert result.enqueued_at <= result.started_at < result.last_attempted_at
    assert result.last_attempted_at <= result.finished_at
    stored = task_backends["default"].get_result(result.id)
    assert (stored.started_at, stored.last_attempted_at) == (
        result.started_at,
        result.last_attempted_at,
    )


@requires_tasks
@pytest.mark.django_db(transaction=True)
def test_backport_tasks_run_through_our_backend_and_worker():
    """The `django_tasks` backport reads the same TASKS setting: its @task builds our tasks."""
    django_tasks = pytest.importorskip("django_tasks")  # CI installs it (the dev extra)
    from tests.testapp import backport_tasks

    assert isinstance(backport_tasks.shout, backends.JobQueueTask)
    result = backport_tasks.shout.using(group="wagtail").enqueue("hello")
    job = Job.objects.get(pk=result.id)
    assert job.type == backends.task_key("default", backport_tasks.shout.module_path)
    assert job.group_key == "wagtail"
    context = backport_tasks.attempt_of.enqueue()
    run_until_finished(result, context)
    assert result.return_value == "HELLO" and context.return_value == 1
    # The backport's names and handler see the same results.
    assert result.status == django_tasks.TaskResultStatus.SUCCESSFUL
    through_backport = django_tasks.task_backends["default"].get_result(result.id)
    assert through_backport.return_value == "HELLO"
    assert through_backport.status == django_tasks.TaskResultStatus.SUCCESSFUL


# -- the Tasks backend reads results without importing what a row names ------------------------


@pytest.mark.django_db
def test_get_result_of_a_forged_row_imports_nothing() -> None:
    backends = pytest.importorskip("django_jobqueue.backends")
    if not backends.HAS_TASKS:
        pytest.skip("django.tasks needs Django 6.0+")
    from django.tasks import task_backends
    from django.tasks.exceptions import TaskResultDoesNotExist

    forged = Job.objects.create(
        type=backends.task_key("default", "tests.unlisted_tasks.side_effect")
    )
    assert "tests.unlisted_tasks" not in sys.modules
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(str(forged.pk))
    assert "tests.unlisted_tasks" not in sys.modules
