"""Django Tasks-framework tasks run through JobQueueBackend (Django 6.0+ only)."""

from __future__ import annotations

import django

if django.VERSION >= (6, 0):
    from django.tasks import TaskContext, task

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
    def explode() -> None:
        raise ValueError("exploded")

    @task(queue_name="emails", priority=10)
    def send_email(to: str) -> str:
        return f"sent to {to}"
