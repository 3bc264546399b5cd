"""The wake path: producers say "there is new work" on commit; idle workers wait for it.

Polling stays the backstop: a worker waits at most its poll interval, so a lost signal costs
latency, never a job. Across processes, PostgreSQL's NOTIFY does the same (worker.listener).
"""

from __future__ import annotations

import threading

_event = threading.Event()


def notify(using: str, queue: str) -> None:
    """Tell waiting workers that `queue` on database `using` has new work (call after commit)."""
    _event.set()


def wait(timeout: float) -> bool:
    """Block up to `timeout` seconds for a notify() in this process; return whether one came."""
    woken = _event.wait(timeout)
    _event.clear()
    return woken


def clear() -> None:
    """Forget earlier wake-ups (the dispatcher calls this before it looks for work)."""
    _event.clear()


def wake_up() -> None:
    """Wake a waiting worker loop now (used on shutdown signals)."""
    _event.set()
