"""The recorder duty: writes the worker's per-minute figures, and samples the backlog.

Every RECORD_EVERY seconds it upserts the worker's own `MinuteCount` rows with the totals its
dispatcher and completer tallied (`metrics.Tally`); once a minute it samples the ready backlog
per queue, unless another worker did for that minute (`metrics.backlog`), and saves it and
deletes the rows older than two days (`metrics.store_sample`), and the rows of rated
resources' windows that every window has left (`limits.window.forget`). See metrics.py for what the
figures are and what they cost.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from django.db import DatabaseError, InterfaceError

from .. import conf, metrics
from ..dialects import Dialect
from ..limits import live, window
from .duty import Duty

RECORD_EVERY = 10.0
logger = logging.getLogger(__name__)


class Recorder(Duty):
    """Write the tally's minutes, and sample the backlog once a minute."""

    def __init__(
        self, dialect: Dialect, *, worker_id: str, tally: metrics.Tally, lock_timeout: float
    ) -> None:
        super().__init__(dialect, interval=RECORD_EVERY, lock_timeout=lock_timeout)
        self.worker_id = worker_id
        self.tally = tally
        self._sampled: dt.datetime | None = None

    def tick(self) -> float | None:
        now = dt.datetime.now(dt.UTC)
        self._write(self.tally.take(now))
        minute = metrics.minute_of(now)
        if self._sampled != minute:
            using = self.dialect.using
            rows = metrics.backlog(using, self.dialect.now())
            if rows is not None:
                self.dialect.run_in_transaction(lambda: metrics.store_sample(using, rows))
                # The rows of rated resources that every window has left (grants' and
                # settlements': a claim forgets its own as it records).
                specs = live.in_force(conf.get(), using)
                self.dialect.run_in_transaction(lambda: window.forget(self.dialect, specs))
            self._sampled = minute
        return None

    def _write(self, minutes: dict[dt.datetime, dict[str, Any]]) -> None:
        """Upsert the minutes in a write transaction of their own, retried on lock contention
        (on SQLite: BEGIN IMMEDIATE and the busy retry, as every worker write); minutes that
        could not be written are written with the next tick's."""
        if not minutes:
            return
        try:
            self.dialect.run_in_transaction(
                lambda: metrics.write(self.dialect.using, self.worker_id, minutes)
            )
        except BaseException:
            self.tally.untake(minutes)
            raise

    def finish(self) -> None:
        try:  # the last seconds' totals, once the worker stops
            self._write(self.tally.take())
        except (DatabaseError, InterfaceError) as exc:
            logger.warning("Could not write the last minute's figures (%s)", exc)
