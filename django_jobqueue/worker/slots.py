"""The handler slots of a worker process: `--concurrency` of them, shared by sync and async.

An executor thread takes a slot before it takes an attempt from the queue, and holds it while
the attempt runs: in the thread for a sync handler, or handed over to the event loop's task
for an async one, which gives it back when the task ends. So prefetched attempts wait in the
queue, unstarted, until a slot is free, and no more handlers than slots run at once, sync and
async together. The executor gives each slot back exactly once (`Executor._finished`): when the
attempt ends, is timed out (abandoned), cancelled, or released unstarted.
"""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger(__name__)


class Slots:
    """A count of `size` slots: `take()` blocks while all are taken; `give_back()` frees one."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.taken = 0
        self._free = threading.Condition(threading.Lock())
        self._waiting = 0  # threads in take() waiting for a slot (under the lock)

    def take(self, timeout: float | None = None) -> bool:
        """Take a slot, waiting up to `timeout` seconds (None: for ever); False if none came."""
        with self._free:
            if self.taken >= self.size:  # a free slot (the usual case) takes no wait at all
                self._waiting += 1
                try:
                    if not self._free.wait_for(lambda: self.taken < self.size, timeout):
                        return False
                finally:
                    self._waiting -= 1
            self.taken += 1
            return True

    def give_back(self) -> None:
        """Free a slot (any thread, the event loop's included)."""
        with self._free:
            if self.taken <= 0:  # a bug of the caller: never let it raise the cap
                logger.error("A handler slot was given back twice; ignored")
                return
            self.taken -= 1
            if self._waiting:  # nobody waits, nobody to wake (notify's cost on every job)
                self._free.notify()
