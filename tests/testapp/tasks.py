"""Django Tasks-framework tasks run through JobQueueBackend (Django 6.0+ only)."""

from __future__ import annotations

import os
import time
from typing import Any

import django

from .models import RunRecord

if django.VERSION >= (6, 0):
    from django.tasks import TaskContext, default_task_backend, task

    @task()
    def add(a: int, b: int) -> int:
        return a + b

    @task(takes_context=True)
    def attempt_number(context: TaskContext) -> int:
        return int(context.attempt)

    @task()
    async def async_mul(a: int, b: int) -> int:
        return a * b

    @task()
    async def async_explode() -> None:
        raise KeyError("async exploded")

    @task()
    def explode() -> None:
        raise ValueError("exploded")

    @task(queue_name="emails", priority=10)
    def send_email(to: str) -> str:
        return f"sent to {to}"

    @task()
    def returns_none() -> None:
        return None

    @task()
    def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
        return {"args": args, "kwargs": kwargs}

    @task(takes_context=True)
    def record_run(context: TaskContext, label: str = "") -> str:
        """Leave a RunRecord per attempt (its pk gives the run order); fail if asked to."""
        now = time.time()
        RunRecord.objects.create(
            job_id=int(context.task_result.id),
            attempt=context.attempt,
            worker_pid=os.getpid(),
            started=now,
            finished=now,
        )
        return label

    @task(takes_context=True)
    def flaky(context: TaskContext) -> dict[str, Any]:
        """Fail the first attempt, succeed on the next; every attempt leaves a RunRecord."""
        RunRecord.objects.create(
            job_id=int(context.task_result.id), attempt=context.attempt, worker_pid=os.getpid()
        )
        if context.attempt == 1:
            raise RuntimeError("first attempt fails")
        return {"attempt": context.attempt, "attempts": context.task_result.attempts}

    @task(takes_context=True)
    def inspect_self(context: TaskContext) -> dict[str, Any]:
        """Report what the task sees of itself: from its context, and read back from the queue."""
        mine = context.task_result
        stored = default_task_backend.get_result(mine.id)
        return {
            "id": mine.id,
            "attempt": context.attempt,
            "context_status": str(mine.status),
            "stored_status": str(stored.status),
            "stored_worker_ids": stored.worker_ids,
            "started_at_set": stored.started_at is not None,
            "finished_at_set": stored.finished_at is not None,
            "pid": os.getpid(),
        }

    @task(takes_context=True)
    def logged(context: TaskContext, label: str) -> str:
        """Log a line through the context's logger: kept with the task's attempt."""
        context.logger.info("task %s, attempt %s", label, context.attempt)
        return label

    @task(takes_context=True)
    def durable_report(context: TaskContext, key: str) -> dict[str, Any]:
        """A task using the durable calls through its context: a step, progress, a sleep, a
        wait for event `key`, a spawned child and a wait for it."""
        first = context.step("first", lambda: context.attempt)
        context.progress(1, 3, "slept")
        context.sleep(0.01)
        payload = context.wait_for_event(key)
        child = context.spawn("durable.child", {"i": 3})
        results = context.wait_for([child])
        context.progress(3, 3, "done")
        return {"first": first, "payload": payload, "child": results[child.pk]}

    @task(takes_context=True)
    async def adurable_report(context: Any, key: str) -> dict[str, Any]:
        """durable_report as an async task: its context's durable calls are awaited."""

        async def attempt() -> int:
            return int(context.attempt)

        first = await context.step("first", attempt)
        await context.progress(1, 3, "slept")
        await context.sleep(0.01)
        payload = await context.wait_for_event(key)
        child = await context.spawn("durable.child", {"i": 3})
        results = await context.wait_for([child])
        await context.progress(3, 3, "done")
        return {"first": first, "payload": payload, "child": results[child.pk]}

    @task(takes_context=True)
    def race_report(context: TaskContext) -> dict[str, Any]:
        """A task waiting, through its context, for the first of two children (the other is
        cancelled), then for one of two more."""
        first = [context.spawn("durable.child", {"i": i}) for i in (1, 2)]
        won = context.wait_for_any(first, cancel_rest=True)
        second = [context.spawn("durable.child", {"i": i}) for i in (3, 4)]
        counted = context.wait_for(second, count=1)
        return {"any": list(won.values()), "count": list(counted.values())}

    @task(takes_context=True)
    async def arace_report(context: Any) -> dict[str, Any]:
        """race_report as an async task: its context's durable calls are awaited."""
        first = [await context.spawn("durable.child", {"i": i}) for i in (1, 2)]
        won = await context.wait_for_any(first, cancel_rest=True)
        second = [await context.spawn("durable.child", {"i": i}) for i in (3, 4)]
        counted = await context.wait_for(second, count=1)
        return {"any": list(won.values()), "count": list(counted.values())}

    @task(takes_context=True)
    def map_report(context: Any) -> list[Any]:
        """A task mapping durable.child over three items, two at once, through its context."""
        return context.map("durable.child", [{"i": i} for i in (1, 2, 3)], concurrency=2)

    @task(takes_context=True)
    async def amap_report(context: Any) -> list[Any]:
        """map_report as an async task: its context's map is awaited."""
        return await context.map("durable.child", [{"i": i} for i in (1, 2, 3)], concurrency=2)

    @task()
    def sleepy(seconds: float) -> str:
        # Short sleeps, so the JobTimeout a worker raises into this thread lands promptly.
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.02)
        return "woke up"


if django.VERSION >= (6, 1):  # @task() passes extra keyword arguments on to task_class

    @task(group="reports", max_attempts=1)
    def grouped_report(name: str) -> str:
        return f"report {name}"

    from . import version_tasks  # noqa: F401 - the tasks of the handler versions' tests
