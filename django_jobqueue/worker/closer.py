"""The closer: fails containers left open longer than OPEN_CONTAINER_TIMEOUT.

A producer killed inside a `container()` block never seals its container, and the jobs after
it would wait forever (see `containers`). Every worker looks for such containers a few times per
timeout and fails them with SKIP LOCKED, so they are failed once whichever worker finds them.
"""

from __future__ import annotations

import logging

from .. import containers
from ..dialects import Dialect
from ..models import Job
from .duty import Duty

logger = logging.getLogger(__name__)


class Closer(Duty):
    """Fails open containers idle for `timeout` seconds, `batch` at a time."""

    def __init__(
        self, dialect: Dialect, *, timeout: float, lock_timeout: float, batch: int
    ) -> None:
        # A container is failed at most a quarter of the timeout late, and looked for at
        # least once a minute.
        interval = min(60.0, max(0.5, timeout / 4))
        super().__init__(dialect, interval=interval, lock_timeout=lock_timeout)
        self.timeout = timeout
        self.batch = batch

    def tick(self) -> float | None:
        # A read first: an idle closer opens no write transaction (on SQLite, that would take
        # the database's write lock for nothing).
        jobs = Job.objects.using(self.dialect.using)
        if not containers.stale(jobs, self.timeout).exists():
            return None
        failed = containers.fail_unsealed(self.dialect, idle_for=self.timeout, batch=self.batch)
        if failed:
            logger.warning(
                "Failed %s container(s) left open (not sealed, nothing added for %gs): ids=%s",
                len(failed), self.timeout, ",".join(str(pk) for pk in failed),
            )  # fmt: skip
        return 0.0 if len(failed) >= self.batch else None
