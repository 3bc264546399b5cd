"""The scheduler: enqueues the due slots of JOBQUEUE["SCHEDULES"].

Every worker runs one; there is no beat process and no leader. A tick reads the schedules'
state rows (no write transaction while nothing is due) and takes each due slot with
`schedules.take_slot()`, which lets exactly one worker enqueue it. Between ticks it sleeps
until the next slot by the schedules' clock, at most `interval`.
"""

from __future__ import annotations

import logging

from .. import schedules as schedules_module
from ..dialects import Dialect
from ..models import ScheduleState
from ..schedules import Clock, Schedule
from .duty import Duty

logger = logging.getLogger(__name__)


class ScheduleRunner(Duty):
    """Enqueues due schedule slots; sleeps until the next one (at most `interval`)."""

    def __init__(
        self,
        dialect: Dialect,
        *,
        schedules: list[Schedule],
        clock: Clock,
        interval: float,
        lock_timeout: float,
    ) -> None:
        super().__init__(dialect, interval=interval, lock_timeout=lock_timeout)
        self.schedules = schedules
        self.clock = clock
        self._ensured = False

    @classmethod
    def duty_name(cls) -> str:
        return "scheduler"

    def tick(self) -> float | None:
        now = self.clock()
        if not self._ensured:
            schedules_module.ensure_states(self.dialect, self.schedules, now)
            self._ensured = True
        last = dict(
            ScheduleState.objects.using(self.dialect.using)
            .filter(name__in=[s.name for s in self.schedules])
            .values_list("name", "last_slot")
        )
        if len(last) < len(self.schedules):
            self._ensured = False  # a row was deleted: create it again at the next tick
        for schedule in self.schedules:
            seen = last.get(schedule.name)
            if seen is not None and schedule.next_after(seen) <= now:
                schedules_module.take_slot(self.dialect, schedule, now)
        until = schedules_module.seconds_until_next(self.schedules, self.clock())
        if until is None:
            return None
        # A little after the slot: the clock was read before the sleep began.
        return min(self.interval, max(0.0, until) + 0.001)
