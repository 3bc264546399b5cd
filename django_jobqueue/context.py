"""The context object a handler registered with ``takes_context=True`` receives first."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import cached_property
from typing import TYPE_CHECKING, Any

from .leases import Lease, renew_leases
from .models import Job

if TYPE_CHECKING:
    from .dialects import Dialect


@dataclasses.dataclass
class JobContext:
    """What a running job may know and do: its id, attempt, upstream results, lease renewal.

    The worker passes one as the first argument to a handler registered with
    ``takes_context=True``; handlers never build one.

    Attributes:
        job: The job row as the worker claimed it.
        attempt: This attempt's number, from 1 (the lease's generation).
        worker_id: The id of the worker running it.
        lease_ttl: The lease TTL that `renew_lease()` applies: the worker's ``--lease-ttl``,
            else ``JOBQUEUE["LEASE_TTL"]``.
    """

    job: Job
    attempt: int
    worker_id: str
    lease_ttl: float
    _dialect: Dialect = dataclasses.field(repr=False)
    _renew: Callable[[], bool] | None = dataclasses.field(default=None, repr=False)

    @property
    def job_id(self) -> int:
        """The running job's primary key."""
        return int(self.job.pk)

    @cached_property
    def upstream_results(self) -> dict[int, Any]:
        """Results of the jobs this job depends on, by job id."""
        upstream = Job.objects.using(self._dialect.using).filter(
            downstream_edges__job_id=self.job.pk
        )
        return dict(upstream.values_list("pk", "result"))

    @property
    def cancelled(self) -> bool:
        """Whether cancellation of this job was requested (asks the database each time)."""
        return (
            Job.objects.using(self._dialect.using)
            .filter(pk=self.job.pk, cancel_requested=True)
            .exists()
        )

    def renew_lease(self) -> bool:
        """Push back this attempt's lease deadline now; False if the lease was lost.

        The worker's heartbeat renews every lease it holds on its own thread, so a handler
        never needs to; this is for a handler that wants to know it still holds its lease.
        """
        if self._renew is not None:
            return self._renew()
        lease = Lease(self.job_id, self.worker_id, self.attempt)
        return renew_leases(self._dialect, [lease], self.lease_ttl, check=True) == 1
