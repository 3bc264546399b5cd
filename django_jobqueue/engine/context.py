"""The context object a handler registered with ``takes_context=True`` receives first: a
JobContext for a sync handler, an AsyncJobContext (whose durable calls are awaited) for an
``async def`` one."""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable, Iterable
from functools import cached_property
from typing import TYPE_CHECKING, Any

from ..lease_results import ClaimedJob
from ..models import Job
from . import budgets, durable, joblogs, maps
from .budgets import Grant
from .leases import Lease, renew_leases

if TYPE_CHECKING:
    from ..dialects import Dialect


class JobContext:
    """What a running job may know and do: its id, attempt, upstream results, lease renewal.

    The worker passes one as the first argument to a handler registered with
    ``takes_context=True``; handlers never build one.

    Attributes:
        job: The job row as the worker claimed it (a Job instance, built at first access: a
            handler that never reads it costs no model instance).
        attempt: This attempt's number, from 1 (the lease's generation).
        worker_id: The id of the worker running it.
        lease_ttl: The lease TTL that `renew_lease()` applies: the worker's ``--lease-ttl``,
            else ``JOBQUEUE["LEASE_TTL"]``.
        logger: A `logging.LoggerAdapter` of the "django_jobqueue.job" logger: what the handler
            logs through it goes to the project's logging (with ``job_id``, ``job_type`` and
            ``attempt`` as extra fields), and the lines at ``JOBQUEUE["JOB_LOG_LEVEL"]`` and
            above are kept with this attempt (`JobLogLine`, shown on the job's admin page).
    """

    def __init__(
        self,
        job: Job | ClaimedJob,
        attempt: int,
        worker_id: str,
        lease_ttl: float,
        _dialect: Dialect,
        _renew: Callable[[], bool] | None = None,
        # Durable calls (see durable.py): the largest step result, and whether sleeps return
        # at once (testing.run_jobs with ignore_delays).
        _max_result_bytes: int | None = None,
        _ignore_delays: bool = False,
        # The job's records as read with its claim (None: read at its first durable call),
        # and the calls at their places.
        _recorded: dict[tuple[str, int], Any] | None = None,
        _places: dict[int, tuple[str, int]] | None = None,
        # Whether limits apply (not in testing.run_jobs), and the database's time at which the
        # claim counted the job's rated `uses` (None: it counted none).
        _apply_limits: bool = True,
        _counted_at: dt.datetime | None = None,
        # What ctx.logger keeps (JOBQUEUE["JOB_LOG_*"]); None: the defaults.
        _log_limits: joblogs.Limits | None = None,
    ) -> None:
        self._job = job
        self.attempt = attempt
        self.worker_id = worker_id
        self.lease_ttl = lease_ttl
        self._dialect = _dialect
        self._renew = _renew
        self._max_result_bytes = _max_result_bytes
        self._ignore_delays = _ignore_delays
        self._apply_limits = _apply_limits
        self._counted_at = _counted_at
        self.job_id: int = int(job.pk)
        """The running job's primary key."""
        self._calls = durable.Calls(_dialect, self.job_id, job.has_steps, _recorded, _places)
        self._progress = durable.Progress()
        # Made here, not at first use: AsyncJobContext._of() copies this object's fields.
        self._lines = joblogs.Lines(
            _dialect.using, self.job_id, attempt, _log_limits or joblogs.Limits(), job.has_steps
        )
        # Records written with the job's next round trip (settlements that give units back).
        self._deferred: list[durable.Deferred] = []
        self._settled: set[Any] | None = None  # the grants settled (budgets._settled)
        # The units this run settled of resources that count tokens, by gen_ai.token.type
        # (filled only with OPENTELEMETRY on: the attempt span's gen_ai.usage.*_tokens).
        self._token_usage: dict[str, int] = {}

    def __repr__(self) -> str:
        return (
            f"JobContext(job_id={self.job_id}, attempt={self.attempt}, "
            f"worker_id={self.worker_id!r}, lease_ttl={self.lease_ttl})"
        )

    @property
    def job(self) -> Job:
        """The job row as the worker claimed it (the columns a claim reads; the others are
        deferred and read at first access)."""
        if isinstance(self._job, ClaimedJob):
            self._job = self._job.model()
        return self._job

    @cached_property
    def logger(self) -> joblogs.JobLogger:
        """The job's logger: see the class's attributes (a LoggerAdapter, made at first use)."""
        return joblogs.JobLogger(self._lines, self._job.type)

    @property
    def _lease(self) -> Lease:
        return Lease(self.job_id, self.worker_id, self.attempt)

    @cached_property
    def upstream_results(self) -> dict[int, Any]:
        """Results of the jobs this job depends on, by job id."""
        upstream = Job.objects.using(self._dialect.using).filter(
            downstream_edges__job_id=self.job_id
        )
        return dict(upstream.values_list("pk", "result"))

    @property
    def cancelled(self) -> bool:
        """Whether cancellation of this job was requested (asks the database each time)."""
        return (
            Job.objects.using(self._dialect.using)
            .filter(pk=self.job_id, cancel_requested=True)
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

    # -- durable calls: kept across the runs of the job (see the how-to on long jobs) ------------

    def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Call `fn(*args, **kwargs)` once for this job, and return its result (JSON).

        The result is recorded the moment `fn` returns, in the transaction `fn` ran in (its
        writes to the job's database and the record commit together), fenced by the job's
        lease. A later run of the job (a retry, a reclaim, a resume) gets the recorded result
        back without calling `fn`. The calls of one name in a run are told apart by their
        order: a step called in a loop keeps one result per call. A step that raises records
        nothing: the attempt fails as usual and its finished steps stay recorded.
        """
        return durable.run(durable.step_plan(self, name, fn, args, kwargs))

    def sleep(self, seconds: float | dt.timedelta) -> None:
        """Suspend the job for `seconds`: it holds no lease, no thread and no limit meanwhile.

        The handler stops at this call; the job is `scheduled` until the time has come, then
        runs again and the call returns at once.
        """
        durable.run(durable.sleep_plan(self, None, seconds))

    def sleep_until(self, when: dt.datetime) -> None:
        """Suspend the job until `when` (an aware datetime), as `sleep()` does."""
        durable.run(durable.sleep_plan(self, when, None))

    def wait_for_event(self, key: str, timeout: float | dt.timedelta | None = None) -> Any:
        """Return the payload of event `key` (`jobqueue.send_event`), suspending until it is
        sent; raise `WaitTimeout` in the resumed handler when `timeout` seconds pass first.

        An event sent before the call is returned at once. The job waits as `waiting`,
        holding no lease, no thread and no limit.
        """
        return durable.run(durable.event_plan(self, key, timeout))

    def spawn(
        self, key: str | None = None, args: dict[str, Any] | None = None, **options: Any
    ) -> Job:
        """Enqueue a child job of this one and return it; a later run returns the same child.

        `key` is the child's handler key (`type=` is taken too, as enqueue() names it). Takes
        enqueue()'s options but `parent`. Whatever waits for this job waits for its children
        too (recursively): it is done once its handler returned and they are done.
        """
        return durable.run(durable.spawn_plan(self, key, args, options))

    def wait_for(
        self, jobs: Iterable[Job | int], count: int | None = None, cancel_rest: bool = False
    ) -> dict[int, Any]:
        """Return {job id: result} once every one of `jobs` is final, or with `count`, once
        the first `count` of them are; suspend until then.

        The result holds every job of `jobs` final by then (more than `count` when several
        became final together). A job that ended `dead` or `cancelled` is final too: it
        counts toward `count`, and the call raises `UpstreamFailed` if one of those is among
        the final ones. With `cancel_rest`, the jobs still unfinished when the wait ends are
        cancelled (`jobqueue.cancel`). The job waits as `waiting`, holding no lease, no
        thread and no limit. Durable: a later run returns the same jobs' results.
        """
        return durable.run(durable.wait_plan(self, jobs, count, cancel_rest))

    def wait_for_any(self, jobs: Iterable[Job | int], cancel_rest: bool = False) -> dict[int, Any]:
        """Return {job id: result} once one of `jobs` is final: `wait_for(jobs, count=1)`."""
        return durable.run(durable.wait_plan(self, jobs, 1, cancel_rest))

    def map(
        self,
        key: str | None,
        items: Iterable[Any],
        concurrency: int | None = None,
        **enqueue_options: Any,
    ) -> list[Any]:
        """Spawn one child of handler `key` per item, at most `concurrency` running at once,
        and return their results in the order of `items` once all are final.

        An item that is a dict is its child's keyword arguments; any other item is the one
        argument ``item``. The children are written together (bulk INSERTs, one transaction
        with the record of the call); the job suspends until all are final, holding no
        lease, no thread and no limit. Raises `UpstreamFailed` if one ended `dead` or
        `cancelled`. `enqueue_options` are enqueue()'s (but `parent`, `depends_on`,
        `unique_key`), for every child; each child's own limits apply as well. An empty
        `items` returns [] at once. Durable: a later run returns the same results and never
        spawns again.
        """
        return durable.run(maps.map_plan(self, key, items, concurrency, enqueue_options))

    def progress(self, current: float, total: float | None = None, message: str = "") -> None:
        """Record how far the job has got (`Job.progress`), at most about once a second."""
        durable.run(durable.progress_plan(self, current, total, message))

    def patched(self, patch_id: str) -> bool:
        """Whether this job takes the new path of a change made in place: True in a run of a
        job that had not yet reached this call when the change was deployed, False in a
        replay of a job that had already passed it under the old code.

        Durable: True is recorded (a durable call, at its place), and every later run of the
        job gets the same answer; the first call of `patch_id` in a run decides, and its later
        calls (in a loop, say) return the same. `patch_id` is 1 to 200 printable characters.
        """
        return durable.run(durable.patch_plan(self, patch_id))

    def acquire(self, resource: str, units: int) -> Grant:
        """Take `units` of `resource` (a resource JOBQUEUE["LIMITS"] gives a rate) now, and
        return the `Grant`; with no room in its window, suspend the job until there is.

        The job waits `scheduled`, holding no lease, no thread and no place under any limit,
        and uses no attempt; it runs again when the window will have room, and the call
        returns then. Durable: a later run gets the same grant back and takes nothing again.
        Raises `InvalidJobError` (before anything is written) for a resource with no rate, an
        unknown one, or units its rate could never grant.
        """
        return budgets.acquire(self, resource, units)

    def settle(self, grant: Grant | str, used: int) -> None:
        """Record what the work of `grant` really used: less gives the rest back to its
        window, more charges the difference to the window it was granted in.

        A charge is written before the call returns; a settlement at or below its grant is
        written with the job's next round trip (its next grant, its next durable call, or the
        end of the run), and its room comes back then.

        `grant` may also be a resource of the job's `uses`: the same for the units its claim
        took. Durable: a later run never settles twice; settling one grant twice raises
        `InvalidJobError`. Sends `units_settled`.
        """
        budgets.settle(self, grant, used)


# The durable calls of an async handler are coroutines where JobContext's are plain methods:
# the same names and arguments, awaited (hence the `override` ignores: mypy sees other
# return types).
class AsyncJobContext(JobContext):
    """The context of an ``async def`` handler: a JobContext whose durable calls are awaited.

    The worker passes one to async handlers registered with ``takes_context=True``
    (``isinstance(ctx, JobContext)`` holds). Each durable call has the meaning, the records
    and the replay rules of JobContext's (a job's records are the same whichever kind of
    handler wrote them); its database work runs off the event loop, on the job's sync-call
    thread, so the loop keeps running the worker's other async jobs meanwhile.
    """

    def __repr__(self) -> str:
        return "Async" + super().__repr__()

    @classmethod
    def _of(cls, context: JobContext) -> AsyncJobContext:
        """An async view of `context`: the same job, with the same records and progress."""
        if isinstance(context, AsyncJobContext):
            return context
        twin = cls.__new__(cls)
        twin.__dict__.update(context.__dict__)
        return twin

    async def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Call `fn(*args, **kwargs)` once for this job, and return its result (JSON).

        An ``async def`` `fn` is awaited on the worker's event loop; its result is then
        recorded, fenced by the lease (its own ORM calls are not part of that transaction,
        which may hold other jobs' records). A plain `fn`
        runs off the loop, on the job's sync-call thread, in the transaction of its record:
        its writes to the job's database and the record commit together, as in a sync
        handler. Otherwise as `JobContext.step`.
        """
        return await durable.arun(durable.step_plan(self, name, fn, args, kwargs))

    async def sleep(self, seconds: float | dt.timedelta) -> None:  # type: ignore[override]
        """Suspend the job for `seconds`, as `JobContext.sleep` does."""
        await durable.arun(durable.sleep_plan(self, None, seconds))

    async def sleep_until(self, when: dt.datetime) -> None:  # type: ignore[override]
        """Suspend the job until `when` (an aware datetime), as `JobContext.sleep_until` does."""
        await durable.arun(durable.sleep_plan(self, when, None))

    async def wait_for_event(self, key: str, timeout: float | dt.timedelta | None = None) -> Any:
        """Return the payload of event `key`, as `JobContext.wait_for_event` does."""
        return await durable.arun(durable.event_plan(self, key, timeout))

    async def spawn(  # type: ignore[override]
        self, key: str | None = None, args: dict[str, Any] | None = None, **options: Any
    ) -> Job:
        """Enqueue a child job of this one and return it, as `JobContext.spawn` does."""
        return await durable.arun(durable.spawn_plan(self, key, args, options))

    async def wait_for(  # type: ignore[override]
        self, jobs: Iterable[Job | int], count: int | None = None, cancel_rest: bool = False
    ) -> dict[int, Any]:
        """Return {job id: result} once every job (or `count` of them) is final, as
        `JobContext.wait_for` does."""
        return await durable.arun(durable.wait_plan(self, jobs, count, cancel_rest))

    async def wait_for_any(  # type: ignore[override]
        self, jobs: Iterable[Job | int], cancel_rest: bool = False
    ) -> dict[int, Any]:
        """Return {job id: result} once one of `jobs` is final, as `JobContext.wait_for_any`
        does."""
        return await durable.arun(durable.wait_plan(self, jobs, 1, cancel_rest))

    async def map(  # type: ignore[override]
        self,
        key: str | None,
        items: Iterable[Any],
        concurrency: int | None = None,
        **enqueue_options: Any,
    ) -> list[Any]:
        """Spawn one child per item and return their results in item order, as
        `JobContext.map` does."""
        return await durable.arun(maps.map_plan(self, key, items, concurrency, enqueue_options))

    async def progress(  # type: ignore[override]
        self, current: float, total: float | None = None, message: str = ""
    ) -> None:
        """Record how far the job has got, as `JobContext.progress` does."""
        await durable.arun(durable.progress_plan(self, current, total, message))

    async def patched(self, patch_id: str) -> bool:  # type: ignore[override]
        """Whether this job takes the new path of a change, as `JobContext.patched` says."""
        return await durable.arun(durable.patch_plan(self, patch_id))

    async def acquire(self, resource: str, units: int) -> Grant:  # type: ignore[override]
        """Take `units` of `resource` now, as `JobContext.acquire` does (the grant's
        transaction runs off the loop, on the job's sync-call thread)."""
        return await durable.in_thread(functools.partial(budgets.acquire, self, resource, units))

    async def settle(self, grant: Grant | str, used: int) -> None:  # type: ignore[override]
        """Record what the work of `grant` really used, as `JobContext.settle` does."""
        await durable.in_thread(functools.partial(budgets.settle, self, grant, used))
