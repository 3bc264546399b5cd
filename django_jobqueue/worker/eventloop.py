"""The worker's event loop: async handlers run as tasks on one long-lived loop of its own.

A worker starts the loop, in a thread named `jobqueue-loop`, when it first meets an async job.
Every async attempt then runs as a task on it: no event loop is built per job, no handler
thread waits on a coroutine, and a client or pool that a handler keeps (in a module global,
say) serves every later job of the worker, since they all run on the same loop.

Invariant: a task's coroutine is awaited on this loop only; `submit()` and `cancel()` are
safe from any thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

logger = logging.getLogger(__name__)

TICK = 0.1  # seconds between the loop's ticks (how a blocked loop is noticed)

Done = Callable[["concurrent.futures.Future[Any]"], None]


class EventLoop:
    """One asyncio loop in a daemon thread, started on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        # When (time.monotonic()) the loop last ran its ticker: a coroutine that blocks the
        # loop stops it (see Executor.hung). 0.0: the loop has not started.
        self.ticked = 0.0

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise RuntimeError("the worker's event loop is stopped (shutdown)")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                started = threading.Event()
                thread = threading.Thread(
                    target=self._run, args=(loop, started), name="jobqueue-loop", daemon=True
                )
                thread.start()
                started.wait()
                self._loop, self._thread = loop, thread
            return self._loop

    def _run(self, loop: asyncio.AbstractEventLoop, started: threading.Event) -> None:
        asyncio.set_event_loop(loop)

        def tick() -> None:
            self.ticked = time.monotonic()
            loop.call_later(TICK, tick)

        tick()
        loop.call_soon(started.set)
        try:
            loop.run_forever()
        finally:
            loop.close()

    def submit(self, coro: Coroutine[Any, Any, Any], done: Done) -> concurrent.futures.Future[Any]:
        """Run `coro` as a task on the loop; `done(future)` is called on the loop's thread."""
        future = asyncio.run_coroutine_threadsafe(coro, self._running_loop())
        future.add_done_callback(done)
        return future

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel the tasks still running (their attempts are settled by now) and stop."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
            self._closed = True
        if loop is None or thread is None:
            return

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=timeout)
            loop.stop()

        try:
            asyncio.run_coroutine_threadsafe(cancel_all(), loop)
        except RuntimeError:  # the loop is closed already
            return
        thread.join(timeout + 1.0)
        if thread.is_alive():
            logger.warning("The worker's event loop did not stop within %ss (a coroutine "
                           "blocks it); leaving it to the process's exit", timeout)  # fmt: skip
