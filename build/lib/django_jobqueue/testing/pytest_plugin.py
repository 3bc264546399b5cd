"""The pytest plugin of django_jobqueue: the `job_queue` fixture.

Enable it in your root conftest.py (it is not loaded automatically, so installing
django_jobqueue changes no project's pytest)::

    pytest_plugins = ["django_jobqueue.testing.pytest_plugin"]

It needs pytest-django: the fixture uses its `db` fixture.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from ..models import Job
    from .assertions import CapturedJobs
    from .runner import RunReport

__all__ = ["JobQueueFixture", "job_queue"]


class JobQueueFixture:
    """What the `job_queue` fixture gives a test: the helpers of `django_jobqueue.testing`.

    Each method is the function of the same name there (`run` is `run_jobs`, `capture` is
    `capture_enqueued`, `jobs` is `enqueued_jobs`).
    """

    def run(
        self,
        *,
        queues: Iterable[str] | None = None,
        ignore_delays: bool = True,
        max_runs: int | None = None,
    ) -> RunReport:
        """Run queued jobs until none is runnable (see `run_jobs`).

        Args:
            queues: Only the jobs of these queues.
            ignore_delays: Treat backoffs, `Retry(delay=...)` and `run_after` as over.
            max_runs: The most attempts to make (default 1000) before `RunawayJobsError`.

        Returns:
            The `RunReport` of the run.
        """
        from .runner import DEFAULT_MAX_RUNS, run_jobs

        return run_jobs(
            queues=queues,
            ignore_delays=ignore_delays,
            max_runs=DEFAULT_MAX_RUNS if max_runs is None else max_runs,
        )

    def assert_enqueued(self, type: Any, args: Any = None, **options: Any) -> list[Job]:
        """Assert a matching job is in the queue (see `assert_enqueued`).

        Args:
            type: A handler key, a registered handler function, or a Django task.
            args: The job's arguments (None: any).
            **options: `kwargs=`, `count=` and field conditions.

        Returns:
            The matching jobs.
        """
        from .assertions import assert_enqueued

        return assert_enqueued(type, args, **options)

    def assert_not_enqueued(self, type: Any, args: Any = None, **options: Any) -> None:
        """Assert no matching job is in the queue (see `assert_not_enqueued`).

        Args:
            type: A handler key, a registered handler function, or a Django task.
            args: The job's arguments (None: any).
            **options: `kwargs=` and field conditions.
        """
        from .assertions import assert_not_enqueued

        assert_not_enqueued(type, args, **options)

    def jobs(self, type: Any = None, args: Any = None, **options: Any) -> list[Job]:
        """The matching jobs in the queue, oldest first (see `enqueued_jobs`).

        Args:
            type: A handler key, a registered handler function, or a Django task; None: any.
            args: The job's arguments (None: any).
            **options: `kwargs=` and field conditions.

        Returns:
            The matching jobs.
        """
        from .assertions import enqueued_jobs

        return enqueued_jobs(type, args, **options)

    def capture(self) -> AbstractContextManager[CapturedJobs]:
        """Capture the jobs enqueued inside a `with` block (see `capture_enqueued`).

        Returns:
            A context manager yielding a `CapturedJobs`.
        """
        from .assertions import capture_enqueued

        return capture_enqueued()


@pytest.fixture
def job_queue(db: None) -> JobQueueFixture:
    """Run and inspect the job queue in a test (with database access, through `db`).

    Works in ordinary `django_db` tests, inside the test's transaction; with
    `@pytest.mark.django_db(transaction=True)` it commits as a worker would.
    """
    return JobQueueFixture()
