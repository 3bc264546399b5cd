"""django_jobqueue: a durable job queue with dependency-driven workflows in your Django database."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from .exceptions import (
    Fail,
    InvalidArgumentsError,
    InvalidDependencyError,
    InvalidJobError,
    JobCancelled,
    JobQueueError,
    JobTimeout,
    LeaseExpired,
    LeaseLost,
    Retry,
    UnknownHandlerError,
    UnsupportedDatabaseError,
    UpstreamFailed,
)
from .registry import handler

if TYPE_CHECKING:
    from .context import JobContext
    from .control import cancel, container, retry
    from .enqueuing import enqueue
    from .graph import Graph, enqueue_many, graph

try:
    __version__ = version("django-jobqueue")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"

__all__ = [
    "Fail",
    "Graph",
    "InvalidArgumentsError",
    "InvalidDependencyError",
    "InvalidJobError",
    "JobCancelled",
    "JobContext",
    "JobQueueError",
    "JobTimeout",
    "LeaseExpired",
    "LeaseLost",
    "Retry",
    "UnknownHandlerError",
    "UnsupportedDatabaseError",
    "UpstreamFailed",
    "cancel",
    "container",
    "enqueue",
    "enqueue_many",
    "graph",
    "handler",
    "retry",
]

# Loaded on first use: they import the models, which need the app registry, and
# `import django_jobqueue` must work in settings and in jobs.py at import time.
_LAZY = {
    "enqueue": "enqueuing",
    "JobContext": "context",
    "cancel": "control",
    "container": "control",
    "retry": "control",
    "Graph": "graph",
    "enqueue_many": "graph",
    "graph": "graph",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'django_jobqueue' has no attribute {name!r}")
    from importlib import import_module

    loaded = import_module(f"{__name__}.{module}")
    # Fix: importing the submodule `graph` makes the import system set this package's
    # attribute `graph` to that module, which then shadowed the `graph()` function: after
    # any use of `jobqueue.Graph` or `enqueue_many`, `jobqueue.graph()` raised "'module'
    # object is not callable". Bind the lazy names of the module now, over the module.
    globals().update({n: getattr(loaded, n) for n, m in _LAZY.items() if m == module})
    return getattr(loaded, name)
