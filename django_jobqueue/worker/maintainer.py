"""The maintainer: the upkeep of the queue's tables that the database is not doing itself.

A queue table is rewritten row by row all day, and on PostgreSQL every claim and finish
leaves a dead row version behind until a VACUUM removes it. Where autovacuum is off, or lags
behind the churn, the dead entries at the front of the ready index make each claim slower
than the last. Every worker looks at the tables' statistics every INTERVAL seconds and runs
what `Dialect.maintain()` says is due (on PostgreSQL a plain VACUUM, never FULL, or an
ANALYZE); a table another worker is already vacuuming is skipped, so it runs once across
them. Where autovacuum keeps up, nothing is ever due. JOBQUEUE["MAINTENANCE"] = False turns
the duty off.
"""

from __future__ import annotations

import logging
import random

from .duty import Duty

logger = logging.getLogger(__name__)

INTERVAL = 2.0  # seconds between looks at the statistics (+-20% jitter)
# A table is due once this many rows, and this fraction of its live rows, have died (or
# changed, for an ANALYZE) since the database last did it. 10,000 dead entries are about 25
# pages of the ready index: a claim reads them in well under a millisecond.
MIN_ROWS = 10_000
FRACTION = 0.05


class Maintainer(Duty):
    """Runs the table upkeep that is due, at most one table statement at a time."""

    def tick(self) -> float | None:
        for statement in self.dialect.maintain(min_rows=MIN_ROWS, fraction=FRACTION):
            logger.info("Ran %s", statement)
        return self.interval * random.uniform(0.8, 1.2)
