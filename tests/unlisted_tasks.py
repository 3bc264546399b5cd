"""A module with a task that no app's tasks.py imports: the worker must never import it.

test_tasks_extras enqueues a job row naming `tests.unlisted_tasks.side_effect` and checks that
the worker marks it dead instead of importing this module to find it.
"""

from __future__ import annotations

import django

IMPORTED = True

if django.VERSION >= (6, 0):
    from django.tasks import task

    @task()
    def side_effect() -> str:
        return "ran"
