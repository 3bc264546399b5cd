"""Where async handlers' sync calls run: a few threads of the worker's own, one job to a thread.

Django runs an async ORM call (`aget`, `acreate`, `sync_to_async(thread_sensitive=True)`)
on one thread per thread-sensitive context, and a worker's async jobs would otherwise share
the process's single one: every job's queries would queue behind the others'. Each async
attempt runs instead in a context of its own (asgiref's `ThreadSensitiveContext`, as Django's
ASGI handler gives each request), bound to the least busy of `size` threads here. A job's
calls then stay on one thread, in order, as a request's do, and the worker's async ORM work
holds at most `size` connections whatever `--concurrency` is.

A thread whose jobs all ended closes its connections after IDLE_CLOSE seconds without a new
one, as a handler thread does; and, as a handler thread does before a job, a thread checks
its connections before an attempt's calls when the worker met database trouble since it last
did (`connection_health.refresh`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import ThreadSensitiveContext
from django.db import connections

from . import connection_health
from .executor import IDLE_CLOSE, tidy_connections


class SyncCallThreads:
    """`size` single-thread executors for the thread-sensitive calls of async attempts."""

    def __init__(self, size: int) -> None:
        # A ThreadPoolExecutor starts its thread on its first call: unused ones cost nothing.
        self._executors = [
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="jobqueue-async-sync")
            for _ in range(size)
        ]
        self._load = [0] * size  # attempts bound to each, running now
        self._ended = [0] * size  # attempts ended on each: an idle close checks it moved not
        self._checked = [-1] * size  # connection_health.epoch() each last checked at
        self._lock = threading.Lock()
        self._aliases = list(connections)

    async def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Await `coro` with its thread-sensitive calls on one of the threads."""
        with self._lock:
            index = min(range(len(self._load)), key=self._load.__getitem__)
            self._load[index] += 1
        executor = self._executors[index]
        epoch = connection_health.epoch()
        if self._checked[index] != epoch:  # before the attempt's calls (one thread, in order)
            self._checked[index] = epoch
            executor.submit(connection_health.refresh, self._aliases)
        try:
            async with ThreadSensitiveContext(executor=executor):
                return await coro
        finally:
            with self._lock:
                self._load[index] -= 1
                self._ended[index] += 1
                idle, ended = self._load[index] == 0, self._ended[index]
            # What the attempt's calls left broken is dropped before the next job's.
            executor.submit(tidy_connections, self._aliases)
            if idle:
                asyncio.get_running_loop().call_later(IDLE_CLOSE, self._close_if_idle, index, ended)

    def _close_if_idle(self, index: int, ended: int) -> None:
        with self._lock:
            if self._load[index] or self._ended[index] != ended:
                return  # a job ran there since: it is not idle
        self._executors[index].submit(connections.close_all)

    def shutdown(self) -> None:
        """Close the threads' connections and let the threads end (without waiting)."""
        for executor in self._executors:
            try:
                executor.submit(connections.close_all)
            except RuntimeError:  # shut down already
                continue
            executor.shutdown(wait=False)
