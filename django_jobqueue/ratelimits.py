"""Rate limits (JOBQUEUE["RATE_LIMITS"]): at most N starts of a group in any sliding window.

Each claim that starts jobs of a rate-limited group records one row (the database clock's
time, how many) in RateLimitStart, and a claim may start only as many more as the rows of
the last window leave room for. The time is read after the claim stamped its jobs'
`started_at` (FairShare.record_starts), so it is never earlier than their stamps. Both
happen inside the claim transaction, under the group's lock row (see FairShare), so claims
in every process and host count each other's starts.

The window is held `MARGIN` longer than the period, and a worker starts each job counted
here within half of it after the count, or hands it back uncharged (worker.dispatcher's
START_WITHIN): so two batches recorded one period apart never start in their handlers less
than a period apart, whatever the CPU makes of the time between claim and handler.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Container, Mapping

from .conf import parse_rate
from .dialects import Dialect
from .models import RateLimitStart

MARGIN = 0.1  # seconds added to each window, for the spread between claim and handler start


class RateLimits:
    """The configured rate limits of one worker, and when a held-back group has room again."""

    def __init__(self, rates: Mapping[str, str]) -> None:
        self.limits = {group: parse_rate(group, rate) for group, rate in rates.items()}
        # When (time.monotonic()) a group held back by its rate gets room again; None: none is.
        self.retry_at: float | None = None
        self._now: dt.datetime | None = None
        self._first: dict[str, dt.datetime] = {}

    def __bool__(self) -> bool:
        return bool(self.limits)

    def window(self, group: str) -> dt.timedelta:
        return dt.timedelta(seconds=self.limits[group][1] + MARGIN)

    def room(self, dialect: Dialect, groups: Container[str]) -> dict[str, int]:
        """Return how many more jobs each rate-limited group of `groups` may start now.

        Call it with the groups' lock rows held, in the claim transaction; `record()` then
        records what the claim started.
        """
        rated = sorted(g for g in self.limits if g in groups)
        self._first = {}
        if not rated:
            return {}
        now = self._now = dialect.now()
        starts = RateLimitStart.objects.using(dialect.using)
        counted: dict[str, int] = {}
        for group in rated:
            rows = list(
                starts.filter(group_key=group, started_at__gt=now - self.window(group))
                .order_by("started_at")
                .values_list("started_at", "count")
            )
            counted[group] = sum(n for _, n in rows)
            if rows:
                self._first[group] = rows[0][0]
        return {g: max(0, self.limits[g][0] - counted[g]) for g in rated}

    def record(
        self,
        dialect: Dialect,
        taken: Mapping[str, int],
        room: Mapping[str, int],
        wanting: Mapping[str, int],
        *,
        at: dt.datetime | None = None,
    ) -> None:
        """Record the starts `taken` per group, forget starts out of every window, and note
        when a group that used up its room (with `wanting` jobs ready) has room again.

        The starts are counted at `at` (a database clock read no earlier than the one `room()`
        made), else at the time `room()` read.
        """
        now = self._now if at is None or self._now is None else max(at, self._now)
        self.retry_at = None
        if now is None or not room:
            return
        starts = RateLimitStart.objects.using(dialect.using)
        starts.bulk_create(
            [
                RateLimitStart(group_key=g, started_at=now, count=n)
                for g, n in sorted(taken.items())
                if n and g in room
            ]
        )
        for group in room:
            starts.filter(group_key=group, started_at__lte=now - self.window(group)).delete()
        waits = [
            (self._first.get(group, now) + self.window(group) - now).total_seconds()
            for group, left in room.items()
            if taken.get(group, 0) >= left and wanting.get(group, 0) > taken.get(group, 0)
        ]
        if waits:
            self.retry_at = time.monotonic() + max(0.0, min(waits)) + 0.001
        self._now = None
