"""The housekeeper: the worker's light periodic duties on one thread and one connection.

A worker used to give each duty a thread and a database connection of its own, and a server's
connections are what runs out first when hosts are added (docs: howto/scale-out.md). The
promoter, reclaimer, recorder, schedule runner, closer and pruner each tick for milliseconds
every second or less often, and each may be late by another's tick without harm: they take
turns here, on the one connection of this thread. Each keeps its own interval, backoff and
`wake()`. What may not wait behind them keeps its own thread: the heartbeat (liveness), the
completer and the dispatcher (every job's path), the listener (it blocks on its connection)
and the maintainer (a VACUUM may take minutes).
"""

from __future__ import annotations

import time

from ..dialects import Dialect
from .duty import Duty


class Housekeeper(Duty):
    """Run the ticks of `members` in turn, each when it is due or woken, on this thread."""

    def __init__(self, dialect: Dialect, members: list[Duty], *, lock_timeout: float) -> None:
        super().__init__(dialect, interval=0.0, lock_timeout=lock_timeout)
        self.members = members
        for member in members:
            member.host = self

    def loop(self) -> None:
        due = dict.fromkeys(self.members, 0.0)  # monotonic time of each member's next tick
        for member in self.members:
            member.idle_timeout = self.idle_timeout
        while not self._stop_event.is_set():
            # Cleared before the members' own events are read: a wake() from now on sets it
            # again, and the sleep below returns at once.
            self._wake_event.clear()
            for member in self.members:
                if self._stop_event.is_set():
                    break
                due_now = member._wake_event.is_set() or due[member] <= time.monotonic()
                if member._stop_event.is_set() or not due_now:
                    continue
                member._wake_event.clear()
                due[member] = time.monotonic() + member.run_once()
            running = [due[m] for m in self.members if not m._stop_event.is_set()]
            self._sleep(min(running, default=time.monotonic() + 1.0) - time.monotonic())

    def finish(self) -> None:
        for member in self.members:
            member.finish()

    def stop_members(self, *, keep: tuple[Duty, ...] = ()) -> None:
        """Stop every member but `keep` (they tick on until this housekeeper stops)."""
        for member in self.members:
            if member not in keep:
                member.stop()

    def describe(self) -> str:
        """`housekeeper (promoter, reclaimer, ...)`, for the worker's log line."""
        return f"{self.duty_name()} ({', '.join(m.duty_name() for m in self.members)})"
