"""Test helpers: run queued jobs inside a test, and assert what was enqueued.

Plain functions, usable from pytest and from Django's `TestCase` alike::

    from django_jobqueue.testing import assert_enqueued, run_jobs

The pytest fixture `job_queue` lives in `django_jobqueue.testing.pytest_plugin`; enable it
with ``pytest_plugins = ["django_jobqueue.testing.pytest_plugin"]`` in your root conftest.py.
Nothing here imports pytest. See the how-to "Test your handlers".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..engine import lazy

if TYPE_CHECKING:
    from .assertions import (
        CapturedJobs,
        assert_enqueued,
        assert_not_enqueued,
        capture_enqueued,
        enqueued_jobs,
    )
    from .runner import RunawayJobsError, RunReport, run_jobs

__all__ = [
    "CapturedJobs",
    "RunReport",
    "RunawayJobsError",
    "assert_enqueued",
    "assert_not_enqueued",
    "capture_enqueued",
    "enqueued_jobs",
    "run_jobs",
]

# Loaded on first use, like the package's own API: they need the models, and this module may
# be imported (by the pytest plugin) before Django is set up.
_LAZY = {
    "CapturedJobs": "assertions",
    "assert_enqueued": "assertions",
    "assert_not_enqueued": "assertions",
    "capture_enqueued": "assertions",
    "enqueued_jobs": "assertions",
    "RunReport": "runner",
    "RunawayJobsError": "runner",
    "run_jobs": "runner",
}


def __getattr__(name: str) -> Any:
    return lazy.load(__name__, _LAZY, name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
