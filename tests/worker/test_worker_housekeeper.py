"""The housekeeper: light duties take turns on one thread, each at its own pace, woken at once,
backing off alone when it fails, and finished (the recorder's last write) when it stops."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from django_jobqueue.dialects import get_dialect
from django_jobqueue.worker.duty import Duty
from django_jobqueue.worker.housekeeper import Housekeeper
from tests.conftest import poll

pytestmark = pytest.mark.django_db(transaction=True)


class Counting(Duty):
    """A duty that counts its ticks (each a query, on the thread's connection)."""

    def __init__(self, name: str, *, interval: float, fails: bool = False) -> None:
        self.name_ = name  # before the thread's, which is named after it
        super().__init__(get_dialect("default"), interval=interval, lock_timeout=1.0)
        self.fails = fails
        self.ticks: list[float] = []
        self.threads: set[str] = set()
        self.finished = False

    def duty_name(self) -> str:  # type: ignore[override]
        return self.name_

    def tick(self) -> float | None:
        self.ticks.append(time.monotonic())
        self.threads.add(threading.current_thread().name)
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        if self.fails:
            raise RuntimeError("this duty always fails")
        return None

    def finish(self) -> None:
        self.finished = True


def test_members_tick_at_their_own_pace_on_the_housekeepers_thread():
    fast = Counting("fast", interval=0.05)
    slow = Counting("slow", interval=3600)
    failing = Counting("failing", interval=0.05, fails=True)
    house = Housekeeper(get_dialect("default"), [fast, slow, failing], lock_timeout=1.0)
    assert house.describe() == "housekeeper (fast, slow, failing)"
    house.start()
    try:
        poll(lambda: len(fast.ticks) >= 20, timeout=60)
        assert len(slow.ticks) == 1  # its first tick at once, the next in an hour
        # The failing one backs off (0.5 s, doubling) and never stops the others.
        assert 1 <= len(failing.ticks) < len(fast.ticks)
        assert failing.failures >= 1 and fast.failures == 0
        slow.wake()  # woken: it ticks now, not in an hour
        poll(lambda: len(slow.ticks) == 2, timeout=30)
        assert fast.threads == slow.threads == {"jobqueue-housekeeper"}
        fast.stop()  # a stopped member ticks no more; the others carry on
        poll(lambda: not fast.ticks or time.monotonic() - fast.ticks[-1] > 0.5, timeout=30)
        stopped_at = len(fast.ticks)
        slow.wake()
        poll(lambda: len(slow.ticks) == 3, timeout=30)
        assert len(fast.ticks) == stopped_at
        assert fast.stopping and not slow.stopping
    finally:
        house.stop(timeout=30)
    assert not house.is_alive()
    assert slow.stopping  # the housekeeper's stop is its members'
    assert fast.finished and slow.finished and failing.finished
