"""JobQueueBackend: django_jobqueue as a backend for Django's Tasks framework (Django 6.0+).

A thin adapter: `enqueue` writes a job row whose handler key names the task, and the worker
runs it through a handler registered when the task was defined. On Django 5.2, which has no
`django.tasks`, this module imports cleanly and defines nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import logging
from collections.abc import Callable, Mapping
from inspect import iscoroutinefunction
from typing import TYPE_CHECKING, Any

from asgiref.sync import async_to_sync
from django.utils import timezone

from .exceptions import RateLimited, Suspend
from .options import JobOptions

try:
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.inspect import get_func_args, is_module_level_function
    from django.utils.json import normalize_json

    HAS_TASKS = True
except ImportError:  # Django < 6.0
    HAS_TASKS = False

if TYPE_CHECKING:
    from .engine.context import AsyncJobContext, JobContext
    from .models import Job

TASK_KEY_PREFIX = "task"

# How job states show as TaskResult statuses: waiting (on upstream jobs), scheduled (for later,
# retries included) and ready jobs are READY; leased and running are RUNNING; done is
# SUCCESSFUL; dead and cancelled FAILED.
STATUS_BY_STATE = {
    "waiting": "READY",
    "scheduled": "READY",
    "ready": "READY",
    "leased": "RUNNING",
    "running": "RUNNING",
    "done": "SUCCESSFUL",
    "dead": "FAILED",
    "cancelled": "FAILED",
}


def task_key(alias: str, module_path: str) -> str:
    """Return the handler key of the task at `module_path` on backend `alias`."""
    return f"{TASK_KEY_PREFIX}:{alias}:{module_path}"


if HAS_TASKS:

    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class DurableTaskContext(TaskContext):  # type: ignore[misc,type-arg]
        """The context of a `takes_context=True` task: Django's, with the durable calls of a
        handler's JobContext (steps, sleeps, events, children, progress)."""

        job: JobContext

        @property
        def logger(self) -> logging.LoggerAdapter[logging.Logger]:
            """See `JobContext.logger`: the lines are kept with the task's attempt."""
            return self.job.logger

        def step(self, name: str, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            """See `JobContext.step`."""
            return self.job.step(name, fn, *args, **kwargs)

        def sleep(self, seconds: float | dt.timedelta) -> None:
            """See `JobContext.sleep`."""
            self.job.sleep(seconds)

        def sleep_until(self, when: dt.datetime) -> None:
            """See `JobContext.sleep_until`."""
            self.job.sleep_until(when)

        def wait_for_event(self, key: str, timeout: float | dt.timedelta | None = None) -> Any:
            """See `JobContext.wait_for_event`."""
            return self.job.wait_for_event(key, timeout)

        def spawn(
            self, key: str | None = None, args: dict[str, Any] | None = None, **options: Any
        ) -> Job:
            """See `JobContext.spawn`."""
            return self.job.spawn(key, args, **options)

        def wait_for(
            self, jobs: Any, count: int | None = None, cancel_rest: bool = False
        ) -> dict[int, Any]:
            """See `JobContext.wait_for`."""
            return self.job.wait_for(jobs, count, cancel_rest)

        def wait_for_any(self, jobs: Any, cancel_rest: bool = False) -> dict[int, Any]:
            """See `JobContext.wait_for_any`."""
            return self.job.wait_for_any(jobs, cancel_rest)

        def map(
            self, key: str | None, items: Any, concurrency: int | None = None, **options: Any
        ) -> list[Any]:
            """See `JobContext.map`."""
            return self.job.map(key, items, concurrency, **options)

        def progress(self, current: float, total: float | None = None, message: str = "") -> None:
            """See `JobContext.progress`."""
            self.job.progress(current, total, message)

        def patched(self, patch_id: str) -> bool:
            """See `JobContext.patched`."""
            return self.job.patched(patch_id)

    # An async task's durable calls are coroutines where DurableTaskContext's are plain
    # methods (hence the `override` ignores), as AsyncJobContext's are JobContext's.
    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class AsyncDurableTaskContext(DurableTaskContext):  # type: ignore[misc]
        """The context of an async `takes_context=True` task: its durable calls are awaited
        (see `AsyncJobContext`)."""

        job: AsyncJobContext

        async def step(self, name: str, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            """See `AsyncJobContext.step`."""
            return await self.job.step(name, fn, *args, **kwargs)

        async def sleep(self, seconds: float | dt.timedelta) -> None:  # type: ignore[override]
            """See `AsyncJobContext.sleep`."""
            await self.job.sleep(seconds)

        async def sleep_until(self, when: dt.datetime) -> None:  # type: ignore[override]
            """See `AsyncJobContext.sleep_until`."""
            await self.job.sleep_until(when)

        async def wait_for_event(
            self, key: str, timeout: float | dt.timedelta | None = None
        ) -> Any:
            """See `AsyncJobContext.wait_for_event`."""
            return await self.job.wait_for_event(key, timeout)

        async def spawn(  # type: ignore[override]
            self, key: str | None = None, args: dict[str, Any] | None = None, **options: Any
        ) -> Job:
            """See `AsyncJobContext.spawn`."""
            return await self.job.spawn(key, args, **options)

        async def wait_for(  # type: ignore[override]
            self, jobs: Any, count: int | None = None, cancel_rest: bool = False
        ) -> dict[int, Any]:
            """See `AsyncJobContext.wait_for`."""
            return await self.job.wait_for(jobs, count, cancel_rest)

        async def wait_for_any(  # type: ignore[override]
            self, jobs: Any, cancel_rest: bool = False
        ) -> dict[int, Any]:
            """See `AsyncJobContext.wait_for_any`."""
            return await self.job.wait_for_any(jobs, cancel_rest)

        async def map(  # type: ignore[override]
            self, key: str | None, items: Any, concurrency: int | None = None, **options: Any
        ) -> list[Any]:
            """See `AsyncJobContext.map`."""
            return await self.job.map(key, items, concurrency, **options)

        async def progress(  # type: ignore[override]
            self, current: float, total: float | None = None, message: str = ""
        ) -> None:
            """See `AsyncJobContext.progress`."""
            await self.job.progress(current, total, message)

        async def patched(self, patch_id: str) -> bool:  # type: ignore[override]
            """See `AsyncJobContext.patched`."""
            return await self.job.patched(patch_id)

    class InvalidTaskArguments(InvalidTask, TypeError):
        """Task arguments that are not JSON-serializable (a TypeError, as Django documents)."""

    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class JobQueueTask(Task):  # type: ignore[type-arg]
        """A Task whose `using()` also takes django_jobqueue's options, and which may have
        versions (`version`, `older_versions`: set in `@task(...)`, not in `using()`)."""

        depends_on: tuple[Any, ...] = ()
        group: str = ""
        weight: int = 1
        unique_key: str | None = None
        max_attempts: int | None = None
        timeout: float | dt.timedelta | None = None
        parent: Any = None
        uses: Any = None  # {resource: units} of JOBQUEUE["LIMITS"]
        # This function's version of the task (a handler version: "" is none), and the
        # functions of its older versions still registered beside it, {version: function},
        # oldest first: a job runs under the version that first ran it (see registry.handler).
        version: str = ""
        older_versions: Mapping[str, Callable[..., Any]] | None = None
        sequence: str | None = None  # the sequence its jobs join
        sequence_on_failure: str | None = None  # "continue" or "block"

        def using(
            self,
            *,
            priority: int | None = None,
            queue_name: str | None = None,
            run_after: dt.datetime | dt.timedelta | None = None,
            backend: str | None = None,
            depends_on: Any = None,
            group: str | None = None,
            weight: int | None = None,
            unique_key: str | None = None,
            max_attempts: int | None = None,
            timeout: float | dt.timedelta | None = None,
            parent: Any = None,
            uses: Any = None,
            sequence: str | None = None,
            sequence_on_failure: str | None = None,
        ) -> JobQueueTask:
            """Return a copy with changed defaults (Django's options plus the queue's own)."""
            changes: dict[str, Any] = {
                name: value
                for name, value in {
                    "priority": priority,
                    "queue_name": queue_name,
                    "run_after": run_after,
                    "backend": backend,
                    "group": group,
                    "weight": weight,
                    "unique_key": unique_key,
                    "max_attempts": max_attempts,
                    "timeout": timeout,
                    "parent": parent,
                    "uses": uses,
                    "sequence": sequence,
                    "sequence_on_failure": sequence_on_failure,
                }.items()
                if value is not None
            }
            if depends_on is not None:
                changes["depends_on"] = tuple(depends_on)
            return dataclasses.replace(self, **changes)

    # The options a JobQueueTask carries under the queue's own names (Django's Task has
    # priority, queue_name and run_after).
    TASK_OPTIONS = JobOptions.names() & (
        {f.name for f in dataclasses.fields(JobQueueTask)}
        - {f.name for f in dataclasses.fields(Task)}
    )

    class JobQueueBackend(BaseTaskBackend):
        """Run Django Tasks through django_jobqueue's durable queue and worker."""

        task_class = JobQueueTask
        supports_defer = True
        supports_async_task = True
        supports_get_result = True
        supports_priority = True

        def __init__(self, alias: str, params: dict[str, Any]) -> None:
            # Built when a module with @task functions is imported: touch no database here.
            super().__init__(alias, params)
            options = {k.upper(): v for k, v in self.options.items()}
            self.default_max_attempts = options.get("MAX_ATTEMPTS")
            self.default_timeout = options.get("TIMEOUT")
            self.default_group = options.get("GROUP", "")
            self._tasks: dict[str, Task[Any, Any]] = {}

        # -- definition -------------------------------------------------------------------

        def validate_task(self, task: Task[Any, Any]) -> None:
            """Validate as Django does (a timedelta run_after is allowed), then allowlist it."""
            run_after = task.run_after
            if isinstance(run_after, dt.timedelta):
                task = dataclasses.replace(task, run_after=None)  # validated at enqueue
            super().validate_task(task)
            if isinstance(task, JobQueueTask):
                if task.weight is not None and task.weight < 1:
                    raise InvalidTask("weight must be at least 1.")
                # Rejected like weight=0: max_attempts=0 and timeout=0 are not "not set", and
                # must not silently become the backend's defaults.
                if isinstance(task.max_attempts, int) and task.max_attempts < 1:
                    raise InvalidTask("max_attempts must be at least 1.")
                timeout = task.timeout
                if isinstance(timeout, dt.timedelta):
                    timeout = timeout.total_seconds()
                if isinstance(timeout, int | float) and timeout <= 0:
                    raise InvalidTask("timeout must be positive.")
                _validate_versions(task)
            self._register(task)

        def _register(self, task: Task[Any, Any]) -> None:
            from django.tasks import task_backends
            from django.utils.module_loading import import_string

            from . import registry

            key = task_key(self.alias, task.module_path)
            if key in self._tasks:
                return
            self._tasks[key] = task
            # The older versions first: the one registered last is the newest.
            for version, func in versions_of(task)[:-1]:
                registry.handler(key, takes_context=True, version=version)(
                    _TaskRunner(self, task, func)
                )
            registry.handler(key, takes_context=True, version=getattr(task, "version", ""))(
                _TaskRunner(self, task)
            )
            # task.using(backend=<another alias on this backend>) enqueues under that alias's
            # key, but a worker process only imports the definitions (made for their own
            # alias): without this it would have no handler and mark such jobs dead.
            # Allowlist the task on every alias of this backend it is valid for.
            for alias, params in task_backends.settings.items():
                if alias == self.alias:
                    continue
                try:  # the class first: no other backend is built as a side effect
                    backend_class = import_string(str(params.get("BACKEND", "")))
                except ImportError:
                    continue
                if not (
                    isinstance(backend_class, type) and issubclass(backend_class, JobQueueBackend)
                ):
                    continue
                other = task_backends[alias]
                if isinstance(other, JobQueueBackend) and (
                    task_key(alias, task.module_path) in other._tasks
                ):
                    continue
                # Validating the copy registers it there; one that is not valid there (its
                # queue, say) cannot be enqueued there either.
                with contextlib.suppress(InvalidTask):
                    dataclasses.replace(task, backend=alias)

        # -- enqueue ----------------------------------------------------------------------

        def enqueue(self, task: Task[Any, Any], args: Any, kwargs: Any) -> TaskResult[Any, Any]:
            """Write a job for `task` and send task_enqueued.

            The row is written in the caller's transaction when that is on the queue database;
            when the queue lives on another database alias it is written there at once, in its
            own transaction, so that the TaskResult has its id.
            """
            from .engine.enqueuing import enqueue_direct

            self.validate_task(task)
            run_after = task.run_after  # a timedelta counts from now on the database clock
            payload = {"args": list(args), "kwargs": dict(kwargs)}
            try:
                payload = json.loads(json.dumps(normalize_json(payload), allow_nan=False))
            except (TypeError, ValueError) as exc:
                raise InvalidTaskArguments(
                    f"Task arguments must be JSON-serializable: {exc}"
                ) from exc
            # Django's validation accepts a whole float (5.0); the queue wants an int.
            options = JobOptions(
                priority=int(task.priority), queue=task.queue_name, run_after=run_after
            )
            refs: dict[str, Any] = {}
            if isinstance(task, JobQueueTask):
                own = {name: getattr(task, name) for name in TASK_OPTIONS}
                own["group"] = own["group"] or self.default_group
                if own["max_attempts"] is None:
                    own["max_attempts"] = self.default_max_attempts
                if own["timeout"] is None:
                    own["timeout"] = self.default_timeout
                options = dataclasses.replace(options, **own)
                refs = {"depends_on": [_job_ref(d) for d in task.depends_on], "parent": task.parent}
            job = enqueue_direct(
                task_key(self.alias, task.module_path), payload, **refs, **options.as_kwargs()
            )
            result = self._result(task, job)
            task_enqueued.send(type(self), task_result=result)
            return result

        # -- results ----------------------------------------------------------------------

        def get_result(self, result_id: str) -> TaskResult[Any, Any]:
            """Return the TaskResult of the job with this id."""
            from .models import Job

            try:
                job = Job.objects.using(_queue_database()).get(pk=int(result_id))
            except (Job.DoesNotExist, ValueError, TypeError):
                raise TaskResultDoesNotExist(result_id) from None
            prefix = f"{TASK_KEY_PREFIX}:{self.alias}:"
            if not job.type.startswith(prefix):
                raise TaskResultDoesNotExist(result_id)
            task = self._tasks.get(job.type) or _import_task(job.type[len(prefix) :], self)
            if task is None:
                raise TaskResultDoesNotExist(result_id)
            return self._result(task, job)

        def _result(self, task: Task[Any, Any], job: Job) -> TaskResult[Any, Any]:
            # result.task is the task as this job was enqueued, read from the row: not the
            # registered task (get_result would lose whatever using() changed), and with the
            # aware datetime the job runs after, not a using(run_after=<timedelta>).
            enqueued: dict[str, Any] = {
                "priority": job.priority,
                "queue_name": job.queue,
                "run_after": job.run_after,
            }
            if any(getattr(task, name) != value for name, value in enqueued.items()):
                # Not when it is no longer valid (its queue since removed from QUEUES, say).
                with contextlib.suppress(InvalidTask):
                    task = dataclasses.replace(task, **enqueued)
            errors = list(job.errors or [])
            if (
                job.state in type(job).FAILED_STATES  # no model import at module level
                and job.last_error
                and (not errors or errors[-1] != job.last_error)
            ):
                errors.append(job.last_error)
            result: TaskResult[Any, Any] = TaskResult(
                task=task,
                id=str(job.pk),
                status=TaskResultStatus(STATUS_BY_STATE[job.state]),
                enqueued_at=job.created_at,
                # Django's started_at is the first attempt's start; rows written before
                # first_started_at existed have only the latest.
                started_at=job.first_started_at or job.started_at,
                finished_at=job.finished_at,
                last_attempted_at=job.started_at,
                args=(job.args or {}).get("args", []),
                kwargs=(job.args or {}).get("kwargs", {}),
                backend=self.alias,
                errors=[
                    TaskError(exception_class_path=e["type"], traceback=e.get("traceback", ""))
                    for e in errors
                ],
                worker_ids=list(job.worker_ids or []),
            )
            if job.state == "done":
                object.__setattr__(result, "_return_value", job.result)
            return result

    def versions_of(task: Task[Any, Any]) -> list[tuple[str, Callable[..., Any]]]:
        """(version, function) of each version of `task`, oldest first: its own is last."""
        older = getattr(task, "older_versions", None) or {}
        return [*older.items(), (getattr(task, "version", ""), task.func)]

    def _validate_versions(task: JobQueueTask) -> None:
        """InvalidTask unless the task's versions are valid handler versions, each once, and
        its older versions functions that Django would take for the task's own."""
        from .registry import VERSION_RE

        if task.older_versions is not None and not isinstance(task.older_versions, Mapping):
            raise InvalidTask(
                "older_versions must be a dict of {version: function}, oldest first, not "
                f"{task.older_versions!r}."
            )
        seen: set[str] = set()
        for version, func in reversed(versions_of(task)):
            if not isinstance(version, str) or not (version == "" or VERSION_RE.fullmatch(version)):
                raise InvalidTask(
                    f"Version {version!r} is invalid: use a string of 1-50 letters, digits, "
                    "'_', '.', ':' or '-' (such as \"2\"), or \"\" for none."
                )
            if version in seen:
                raise InvalidTask(
                    f"Version {version!r} is the task's own: older_versions lists the others."
                )
            if func is not task.func and not (
                is_module_level_function(func)
                and (not task.takes_context or get_func_args(func)[:1] == ["context"])
            ):
                raise InvalidTask(
                    f"older_versions[{version!r}] must be a function defined at a module level"
                    + (", with a first argument 'context'" if task.takes_context else "")
                    + f", as the task's: not {func!r}."
                )
            seen.add(version)

    class _TaskRunner:
        """The handler the worker calls for a task (or for one of its older versions, `func`):
        context, signals and the call itself."""

        def __init__(
            self,
            backend: JobQueueBackend,
            task: Task[Any, Any],
            func: Callable[..., Any] | None = None,
        ) -> None:
            self.backend = backend
            self.task = task
            self.func = func or task.func
            self.__name__ = task.name
            # The registry tells two functions of one version apart by their qualified names.
            self.__qualname__ = (
                task.module_path
                if func is None
                else f"{task.module_path}[{getattr(func, '__qualname__', repr(func))}]"
            )
            self.__module__ = task.func.__module__

        def __call__(self, ctx: JobContext, args: list[Any], kwargs: dict[str, Any]) -> Any:
            job = ctx.job
            deferred = job.get_deferred_fields()
            if deferred:  # the claim reads only what running a job needs: the rest, at once
                job.refresh_from_db(fields=sorted(deferred - {"result"}))
            job.started_at = timezone.now()
            if job.first_started_at is None:
                job.first_started_at = job.started_at
            job.state = "running"
            result: TaskResult[Any, Any] = self.backend._result(self.task, job)
            task_started.send(type(self.backend), task_result=result)
            try:
                if self.task.takes_context:
                    args = [self._context(result, ctx), *args]
                # As Task.call does, with this version's function.
                if iscoroutinefunction(self.func):
                    value = async_to_sync(self.func)(*args, **kwargs)
                else:
                    value = self.func(*args, **kwargs)
                value = normalize_json(value)
            except (Suspend, RateLimited):
                raise  # a durable sleep or wait, or a closed quota: it runs later, not failed
            except BaseException as exc:
                cls = type(exc)
                from traceback import format_exception

                result.errors.append(
                    TaskError(
                        exception_class_path=f"{cls.__module__}.{cls.__qualname__}",
                        traceback="".join(format_exception(exc)),
                    )
                )
                object.__setattr__(result, "status", TaskResultStatus.FAILED)
                object.__setattr__(result, "finished_at", timezone.now())
                # Sent from inside the except block, so the signal's logger sees the traceback.
                task_finished.send(type(self.backend), task_result=result)
                raise
            object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
            object.__setattr__(result, "finished_at", timezone.now())
            object.__setattr__(result, "_return_value", value)
            task_finished.send(type(self.backend), task_result=result)
            return value

        def _context(self, result: TaskResult[Any, Any], ctx: JobContext) -> DurableTaskContext:
            """The task's context: with awaited durable calls for an async task (which runs
            on a loop of its own through `async_to_sync`, as Django's `Task.call` runs it,
            its database calls back in this thread)."""
            if iscoroutinefunction(self.func):
                from .engine.context import AsyncJobContext

                return AsyncDurableTaskContext(task_result=result, job=AsyncJobContext._of(ctx))
            return DurableTaskContext(task_result=result, job=ctx)

    def _job_ref(dependency: Any) -> Any:
        """Accept a TaskResult, a Job or a job id as a dependency."""
        if isinstance(dependency, TaskResult):
            return int(dependency.id)
        return dependency

    def _import_task(module_path: str, backend: JobQueueBackend) -> Task[Any, Any] | None:
        """Find a task defined in this process (for any alias) to read a result with.

        Only tasks already defined here (tasks.py modules are discovered at start-up) are
        resolved: importing the module a row's type names would let a forged row make the
        web process import any module.
        """
        from . import registry

        suffix = f":{module_path}"
        for key in registry.allowlist():
            if not (key.startswith(f"{TASK_KEY_PREFIX}:") and key.endswith(suffix)):
                continue
            runner = registry.get(key).func
            task = getattr(runner, "task", None)
            if not isinstance(task, Task) or task.module_path != module_path:
                continue
            if task.backend != backend.alias:
                # A task defined for another alias and enqueued on this one with
                # using(backend=...): read its result as this alias's.
                try:
                    task = dataclasses.replace(task, backend=backend.alias)
                except InvalidTask:
                    continue
            return task
        return None


def _queue_database() -> str:
    from . import conf

    return conf.get().database
