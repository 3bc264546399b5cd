"""The wake path: producers say "there is new work" on commit; idle workers wait for it.

Polling stays the backstop: a worker waits at most its poll interval, so a lost signal costs
latency, never a job. Across processes, PostgreSQL's NOTIFY does the same (worker.listener).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from django.db import transaction

if TYPE_CHECKING:
    from ..dialects import Dialect

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


def promote(dialect: Dialect, candidates: list[int]) -> None:
    """Make those of the waiting jobs `candidates` whose upstreams are all done runnable.

    They become `ready`, or `scheduled` when their `run_after` lies in the future. The ids
    travel as one parameter where the database allows (dialect.id_set): a fan-out of
    thousands of jobs is a few statements, each joining edges to jobs by index.
    """
    if candidates:
        notify_on_commit(dialect, dialect.promote(candidates))


def notify_on_commit(dialect: Dialect, queues: str | Iterable[str]) -> None:
    """Wake workers for `queues` once the current transaction commits.

    Workers of this process through the in-process wake, those of other processes and hosts
    through the database when it can push (PostgreSQL NOTIFY, sent in this transaction).
    """
    names = sorted({queues} if isinstance(queues, str) else set(queues))
    if not names:
        return
    dialect.notify(names)
    for queue in names:
        transaction.on_commit(
            lambda q=queue: notify(dialect.using, q),  # type: ignore[misc]
            using=dialect.using,
        )
