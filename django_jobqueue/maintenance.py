"""Duties any worker performs for all: reclaim expired leases, sweep stale worker rows."""

from __future__ import annotations

import datetime as dt
import logging

from . import workflows
from .dialects import Dialect
from .dialects.functions import DbNow
from .leases import backoff_seconds
from .models import Job, Worker

logger = logging.getLogger(__name__)


def reclaim_expired(
    dialect: Dialect, *, batch: int, backoff: float, backoff_max: float
) -> list[tuple[int, str]]:
    """Move up to `batch` jobs whose lease expired back to `ready` (with backoff) or to `dead`.

    Rows another worker holds locked are skipped, so concurrent sweeps never wait on each
    other. The attempt was counted at claim, so a job that keeps killing its worker reaches
    `dead` after `max_attempts` reclaims. Returns (job id, new state) pairs.
    """

    def txn() -> list[tuple[int, str]]:
        jobs = Job.objects.using(dialect.using)
        expired = list(
            dialect.lock(jobs.expired().order_by("lease_expires", "pk")).values_list(
                "pk",
                "attempts",
                "max_attempts",
                "lease_owner",
                "parent_id",
                "cancel_requested",
                "errors",
            )[:batch]
        )
        moved: list[tuple[int, str]] = []
        for pk, attempts, max_attempts, owner, parent_id, cancel_requested, errors in expired:
            error = {
                "type": "django_jobqueue.exceptions.LeaseExpired",
                "message": f"lease of worker {owner} expired during attempt {attempts}",
                "traceback": "",
                "attempt": attempts,
            }
            if cancel_requested or attempts >= max_attempts:
                state = Job.State.CANCELLED if cancel_requested else Job.State.DEAD
                jobs.filter(pk=pk).update(
                    **workflows.terminal_values(state, last_error=error, errors=[*errors, error])
                )
                workflows.on_terminal(dialect, pk, state, parent_id)
            else:
                state = Job.State.READY
                delay = dt.timedelta(seconds=backoff_seconds(attempts, backoff, backoff_max))
                jobs.filter(pk=pk).update(
                    state=state,
                    run_after=DbNow() + delay,
                    lease_owner=None,
                    lease_expires=None,
                    last_error=error,
                    errors=[*errors, error],
                    updated_at=DbNow(),
                )
            moved.append((pk, state))
        return moved

    moved = dialect.run_in_transaction(txn)
    for pk, state in moved:
        logger.warning("Reclaimed expired lease of job id=%s -> %s", pk, state)
    return moved


def sweep_workers(dialect: Dialect, *, stale_after: float) -> int:
    """Delete Worker rows whose heartbeat is older than `stale_after` seconds."""
    deleted, _ = (
        Worker.objects.using(dialect.using)
        .filter(heartbeat_at__lt=DbNow() - dt.timedelta(seconds=stale_after))
        .delete()
    )
    return deleted
