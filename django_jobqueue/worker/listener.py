"""The listener: push wake-up on PostgreSQL (LISTEN/NOTIFY), on a dedicated connection.

Every transaction that makes jobs ready sends a NOTIFY naming their queue (a trigger on
INSERT, and the code paths that promote, retry or release jobs), delivered when it commits:
a producer in a web process wakes the idle workers of every process and host at once.
Polling stays the backstop: a missed notification costs at most POLL_INTERVAL.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..dialects import Dialect
from .duty import Duty

logger = logging.getLogger(__name__)


class WakeListener(Duty):
    """Waits for notifications and wakes the dispatcher when one names a queue it serves."""

    retry_after = 1.0
    max_backoff = 10.0

    @classmethod
    def duty_name(cls) -> str:
        # The thread and the log lines kept the duty's name from before the class was renamed:
        # operators and their alerts read "Worker duty listener failed".
        return "listener"

    def __init__(
        self,
        dialect: Dialect,
        *,
        queues: list[str],
        on_notify: Callable[[], None],
        lock_timeout: float,
    ) -> None:
        super().__init__(dialect, interval=0.0, lock_timeout=lock_timeout)
        self.queues = set(queues)
        self.on_notify = on_notify
        self._listener: Any = None
        self.listening = False

    def tick(self) -> float | None:
        if self._listener is None:
            self._listener = self.dialect.listen()  # type: ignore[attr-defined]
            self.listening = True
            self.on_notify()  # notifications may have been missed while not listening
        payloads = self._listener.wait(timeout=1.0)
        if payloads and (not self.queues or self.queues.intersection(payloads)):
            self.on_notify()
        return 0.0

    def on_error(self, exc: BaseException) -> None:
        self._listener = None
        self.listening = False
