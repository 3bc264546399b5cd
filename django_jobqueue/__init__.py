"""django_jobqueue: a durable job queue with dependency-driven workflows in your Django database."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from .exceptions import (
    Fail,
    InvalidArgumentsError,
    InvalidDependencyError,
    InvalidJobError,
    JobQueueError,
    JobTimeout,
    LeaseExpired,
    LeaseLost,
    Retry,
    UnknownHandlerError,
    UnsupportedDatabaseError,
)
from .registry import handler

if TYPE_CHECKING:
    from .context import JobContext
    from .enqueuing import enqueue

try:
    __version__ = version("django-jobqueue")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"

__all__ = [
    "Fail",
    "InvalidArgumentsError",
    "InvalidDependencyError",
    "InvalidJobError",
    "JobContext",
    "JobQueueError",
    "JobTimeout",
    "LeaseExpired",
    "LeaseLost",
    "Retry",
    "UnknownHandlerError",
    "UnsupportedDatabaseError",
    "enqueue",
    "handler",
]


def __getattr__(name: str) -> Any:
    # enqueue and JobContext import the models, which need the app registry: load them lazily
    # so that `import django_jobqueue` works in settings and in jobs.py at import time.
    if name == "enqueue":
        from .enqueuing import enqueue

        return enqueue
    if name == "JobContext":
        from .context import JobContext

        return JobContext
    raise AttributeError(f"module 'django_jobqueue' has no attribute {name!r}")
