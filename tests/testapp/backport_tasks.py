"""Tasks defined with the `django_tasks` backport's @task, as Wagtail 8 defines its own."""

from __future__ import annotations

import django

if django.VERSION >= (6, 0):
    try:
        from django_tasks import task
    except ImportError:  # the backport is not installed: the tests that need it skip
        pass
    else:

        @task()
        def shout(text: str) -> str:
            return text.upper()

        @task(takes_context=True)
        def attempt_of(context: object) -> int:
            return int(context.attempt)  # type: ignore[attr-defined]
