"""django_jobqueue: a durable job queue with dependency-driven workflows in your Django database."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from .engine import lazy
from .exceptions import (
    Fail,
    HandlerRegistrationError,
    InvalidArgumentsError,
    InvalidDependencyError,
    InvalidJobError,
    JobCancelled,
    JobQueueError,
    JobTimeout,
    LeaseExpired,
    LeaseLost,
    RateLimited,
    ReplayMismatch,
    Retry,
    UnknownHandlerError,
    UnsupportedDatabaseError,
    UpstreamFailed,
    WaitTimeout,
)
from .registry import handler

if TYPE_CHECKING:
    from .containers import container
    from .engine.budgets import Grant
    from .engine.context import AsyncJobContext, JobContext
    from .engine.control import cancel, retry, run_now
    from .engine.enqueuing import aenqueue, enqueue
    from .engine.events import asend_event, send_event
    from .graphs import Graph, enqueue_many, graph
    from .inbox import record_effect
    from .pausing import pause_resource, pause_workflow, resume_resource, resume_workflow
    from .schedules import schedule

try:
    __version__ = version("django-jobqueue")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"

__all__ = [
    "AsyncJobContext",
    "Fail",
    "Grant",
    "Graph",
    "HandlerRegistrationError",
    "InvalidArgumentsError",
    "InvalidDependencyError",
    "InvalidJobError",
    "JobCancelled",
    "JobContext",
    "JobQueueError",
    "JobTimeout",
    "LeaseExpired",
    "LeaseLost",
    "RateLimited",
    "ReplayMismatch",
    "Retry",
    "UnknownHandlerError",
    "UnsupportedDatabaseError",
    "UpstreamFailed",
    "WaitTimeout",
    "aenqueue",
    "asend_event",
    "cancel",
    "container",
    "enqueue",
    "enqueue_many",
    "graph",
    "handler",
    "pause_resource",
    "pause_workflow",
    "record_effect",
    "resume_resource",
    "resume_workflow",
    "retry",
    "run_now",
    "schedule",
    "send_event",
]

# Loaded on first use: they import the models, which need the app registry, and
# `import django_jobqueue` must work in settings and in jobs.py at import time.
_LAZY = {
    "enqueue": "enqueuing",
    "aenqueue": "enqueuing",
    "JobContext": "context",
    "AsyncJobContext": "context",
    "cancel": "control",
    "container": "containers",
    "retry": "control",
    "run_now": "control",
    "Graph": "graphs",
    "Grant": "engine.budgets",
    "enqueue_many": "graphs",
    "graph": "graphs",
    "record_effect": "inbox",
    "pause_resource": "pausing",
    "resume_resource": "pausing",
    "pause_workflow": "pausing",
    "resume_workflow": "pausing",
    "schedule": "schedules",
    "send_event": "events",
    "asend_event": "events",
}


def __getattr__(name: str) -> Any:
    return lazy.load(__name__, _LAZY, name)


def __dir__() -> list[str]:
    # The lazy names too, so that dir() and completion show the whole public API.
    return sorted(set(globals()) | set(_LAZY))
