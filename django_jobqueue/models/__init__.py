"""The queue's tables: Job, JobDependency, Worker, and the state of limits, schedules, queues."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any, ClassVar

from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .fields import KeyField
from .functions import DbNow
from .indexes import PartialIndex, ReadyIndex, StateIndex

# The index of the ready jobs of one group, in claim order (a dialect may name it in a hint).
READY_GROUP_INDEX = "jobqueue_job_ready_group"
# The index of the ready jobs of one queue, in claim order.
READY_QUEUE_INDEX = "jobqueue_job_ready_queue"


class JobQuerySet(models.QuerySet["Job"]):
    """Querysets whose methods name states."""

    def ready(self) -> JobQuerySet:
        """Jobs a worker may claim now: `ready` and past their `run_after` (database clock)."""
        return self.filter(state=Job.State.READY).filter(
            Q(run_after__isnull=True) | Q(run_after__lte=DbNow())
        )

    def due(self) -> JobQuerySet:
        """Scheduled jobs whose `run_after` has passed (database clock): ready to promote."""
        return self.filter(state=Job.State.SCHEDULED, run_after__lte=DbNow())

    def in_flight(self) -> JobQuerySet:
        """Jobs held by a worker's lease (`leased` or `running`).

        Said through `lease_expires`, which the lease-shape constraint ties to those states,
        so that the partial index of the leases finds them without reading the table: the
        claim counts the jobs in flight under every limit.
        """
        return self.filter(lease_expires__isnull=False)

    def expired(self) -> JobQuerySet:
        """Jobs whose lease has run out by the database clock."""
        return self.in_flight().filter(lease_expires__lt=DbNow())

    def terminal(self) -> JobQuerySet:
        """Jobs in a final state."""
        return self.filter(state__in=Job.TERMINAL_STATES)

    def in_queues(self, queues: list[str] | tuple[str, ...] | None) -> JobQuerySet:
        """Jobs in any of `queues` (all queues when empty or None)."""
        return self.filter(queue__in=queues) if queues else self


class Job(models.Model):
    """One unit of work: a handler key, its arguments, and where it stands."""

    class State(models.TextChoices):
        WAITING = "waiting", _("waiting")  # blocked on upstream jobs, or a container
        SCHEDULED = "scheduled", _("scheduled")  # runnable once run_after has passed
        READY = "ready", _("ready")  # runnable now
        LEASED = "leased", _("leased")  # claimed by a worker, not started yet
        RUNNING = "running", _("running")  # its handler is executing
        DONE = "done", _("done")  # finished with a result (terminal)
        DEAD = "dead", _("dead")  # failed for good (terminal)
        CANCELLED = "cancelled", _("cancelled")  # cancelled before it finished (terminal)

    # Held by a worker's lease: in flight.
    LEASED_STATES: ClassVar[tuple[str, ...]] = (State.LEASED, State.RUNNING)
    # Final: nothing runs the job again unless it is retried.
    TERMINAL_STATES: ClassVar[tuple[str, ...]] = (State.DONE, State.DEAD, State.CANCELLED)
    # Final without a result: a job that depends on one can never run (it is cancelled).
    FAILED_STATES: ClassVar[tuple[str, ...]] = (State.DEAD, State.CANCELLED)
    # Not final yet, in State order (the order of the stats' and the overview's columns).
    UNFINISHED_STATES: ClassVar[tuple[str, ...]] = (
        State.WAITING,
        State.SCHEDULED,
        State.READY,
        State.LEASED,
        State.RUNNING,
    )
    # Not claimed yet: no worker holds them.
    PENDING_STATES: ClassVar[tuple[str, ...]] = (State.WAITING, State.SCHEDULED, State.READY)
    # Will run with nothing else to finish first: now, or once run_after has passed.
    RUNNABLE_STATES: ClassVar[tuple[str, ...]] = (State.SCHEDULED, State.READY)

    type = KeyField(_("handler key"), max_length=200)
    # The version of its handler that first ran it (its first claim writes it), and every
    # later run uses: "" for a handler without one, and for a job not started yet. A default
    # in the database too: during a rolling deploy, the processes of the release before
    # insert jobs without it.
    handler_version = KeyField(
        _("handler version"), max_length=50, default="", db_default="", blank=True
    )
    args = models.JSONField(_("arguments"), default=dict)
    result = models.JSONField(_("result"), null=True, blank=True)
    state = models.CharField(_("state"), max_length=16, choices=State.choices, default=State.READY)
    attempts = models.IntegerField(_("attempts"), default=0)
    max_attempts = models.IntegerField(_("max attempts"), default=3)
    queue = KeyField(_("queue"), max_length=100, default="default")
    priority = models.IntegerField(_("priority"), default=0)
    group_key = KeyField(_("group"), max_length=200, default="", blank=True)
    weight = models.IntegerField(_("weight"), default=1)
    parent = models.ForeignKey(
        "self",
        verbose_name=_("container"),
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="children",
        db_index=False,  # jobqueue_job_parent below, over the rows that have one
    )
    run_after = models.DateTimeField(_("run after"), null=True, blank=True)
    timeout = models.FloatField(_("timeout (seconds)"), null=True, blank=True)
    lease_owner = KeyField(_("lease owner"), max_length=255, null=True, blank=True)
    lease_expires = models.DateTimeField(_("lease expires"), null=True, blank=True)
    heartbeat_at = models.DateTimeField(_("last heartbeat"), null=True, blank=True)
    last_error = models.JSONField(_("last error"), null=True, blank=True)
    errors = models.JSONField(_("errors"), default=list, blank=True)  # one per failed attempt
    worker_ids = models.JSONField(_("workers"), default=list, blank=True)  # one per start
    is_container = models.BooleanField(_("container"), default=False)
    # Set once a job depends on this one: a job without dependents and without a container
    # finishes without looking for downstream work (the row says so; no query needed).
    has_dependents = models.BooleanField(_("has dependents"), default=False, editable=False)
    # A sealed container's children that are not final yet; it rolls up when this reaches 0.
    open_children = models.IntegerField(_("open children"), default=0, editable=False)
    sealed = models.BooleanField(_("sealed"), default=False)  # a container takes no more children
    # Set once the job spawned a child while it ran (ctx.spawn): when its handler returns, it
    # waits for its children as a sealed container does (see workflows.seal_spawner).
    has_children = models.BooleanField(_("has children"), default=False, editable=False)
    # Set once a durable call of its handler recorded something (a JobStep row): a run reads
    # the job's records only then, and a job's first run asks for none (the claim says so).
    has_steps = models.BooleanField(_("has steps"), default=False, editable=False)
    # What ctx.progress() last recorded: {"current", "total", "message", "updated_at"}.
    progress = models.JSONField(_("progress"), null=True, blank=True)
    # The resources of JOBQUEUE["LIMITS"] it uses, with the units of each ({"openai": 1}).
    uses = models.JSONField(_("uses"), null=True, blank=True)
    cancel_requested = models.BooleanField(_("cancel requested"), default=False)
    cancelled_by = models.ForeignKey(
        "self",
        verbose_name=_("cancelled because of"),
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_index=False,  # jobqueue_job_cancelled_by below, over the rows that have one
    )
    unique_key = KeyField(_("unique key"), max_length=255, null=True, blank=True)
    # The sequence it belongs to (sequences.py): its jobs start one at a time, in enqueue order.
    sequence = KeyField(_("sequence"), max_length=255, null=True, blank=True)
    # Whether its ending `dead` stops its sequence until it is retried or cancelled ("block"),
    # rather than letting the next job start ("continue"). A default in the database too: the
    # processes of the release before insert jobs without it.
    sequence_blocks = models.BooleanField(
        _("blocks its sequence when dead"), default=False, db_default=False
    )
    # 1 while the job is not final, NULL once it is: (unique_key, unique_slot) is unique, and
    # NULLs never collide, so a key is held by at most one unfinished job on every database.
    unique_slot = models.SmallIntegerField(null=True, blank=True, default=1, editable=False)
    # The W3C traceparent of the span that enqueued it, when JOBQUEUE["OPENTELEMETRY"] is on
    # (telemetry/): its attempts' spans continue that trace. NULL otherwise (no bytes in the
    # row, and what the inserts of a release before it leave), so not "" as Django prefers.
    traceparent = models.CharField(  # noqa: DJ001
        _("trace parent"), max_length=55, null=True, blank=True, editable=False
    )
    created_at = models.DateTimeField(_("created"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated"), auto_now=True)
    started_at = models.DateTimeField(_("started"), null=True, blank=True)  # latest attempt
    first_started_at = models.DateTimeField(_("first started"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished"), null=True, blank=True)

    objects = JobQuerySet.as_manager()

    class Meta:
        verbose_name = _("job")
        verbose_name_plural = _("jobs")
        # The admin's job page actions that need more than the change permission.
        permissions = [
            ("send_event", _("Can send an event to a job that waits for one")),
            ("run_now", _("Can make a scheduled job due now")),
            ("enqueue_job", _("Can enqueue a job from the admin")),
            ("run_again", _("Can enqueue a job again with its arguments")),
            ("pause_resource", _("Can pause and resume a resource")),
            ("pause_workflow", _("Can pause and resume a workflow")),
        ]
        indexes = [
            # Partial on PostgreSQL and SQLite, composite on MySQL/MariaDB: see ReadyIndex.
            ReadyIndex(fields=["-priority", "id"], name="jobqueue_job_ready"),
            # The best ready job of one group, for fair share and group limits.
            StateIndex(
                fields=["group_key", "-priority", "id"],
                state="ready",
                name=READY_GROUP_INDEX,
            ),
            # The best ready job of one queue, for a worker that serves one queue: through the
            # ready index it would read every other queue's ready jobs ahead of its own.
            StateIndex(fields=["queue", "-priority", "id"], state="ready", name=READY_QUEUE_INDEX),
            # Scheduled jobs by due time, for the promoter.
            StateIndex(
                fields=["run_after", "id"], state="scheduled", name="jobqueue_job_scheduled"
            ),
            # Partial where the database allows (every index a row is in costs each UPDATE of
            # it): leases of the jobs in flight, for the reclaimer; finished jobs by finish time.
            # The conditions say "in flight" and "final" through the columns the check
            # constraints tie to those states, so that a comparison on the column implies them
            # (SQLite cannot match `state IN (%s, %s)` with bound parameters to an index).
            PartialIndex(
                fields=["lease_expires"],
                where=Q(lease_expires__isnull=False),
                name="jobqueue_job_lease_expires",
            ),
            PartialIndex(
                fields=["state", "finished_at"],
                where=Q(finished_at__isnull=False),
                name="jobqueue_job_state_finished",
            ),
            # Waiting jobs by queue, for the admin's overview: every other unfinished state
            # has an index of its own already. On MySQL/MariaDB an index on queue (a column
            # no UPDATE changes), which the ready index's leading state column makes moot there.
            PartialIndex(
                fields=["queue"], where=Q(state="waiting"), name="jobqueue_job_waiting_queue"
            ),
            # The two nullable references, over the rows that have one. A plain index on a
            # column that is NULL in most rows misleads SQLite once ANALYZE has run (its
            # statistics count the NULLs as one value shared by every row, so `parent_id = ?
            # AND state = ?` scanned the table instead); partial, it counts only real values.
            # MySQL/MariaDB index every row (its foreign keys need an index there anyway).
            PartialIndex(
                fields=["parent"], where=Q(parent__isnull=False), name="jobqueue_job_parent"
            ),
            PartialIndex(
                fields=["cancelled_by"],
                where=Q(cancelled_by__isnull=False),
                name="jobqueue_job_cancelled_by",
            ),
            # The jobs of one sequence in enqueue order, over the rows that have one: the next
            # job to release, and the admin's queue of a sequence.
            PartialIndex(
                fields=["sequence", "id"],
                where=Q(sequence__isnull=False),
                name="jobqueue_job_sequence",
            ),
        ]
        constraints = [
            models.CheckConstraint(
                name="jobqueue_job_lease_shape",
                condition=(
                    Q(
                        state__in=["leased", "running"],
                        lease_owner__isnull=False,
                        lease_expires__isnull=False,
                    )
                    | (
                        ~Q(state__in=["leased", "running"])
                        & Q(lease_owner__isnull=True, lease_expires__isnull=True)
                    )
                ),
            ),
            models.CheckConstraint(
                name="jobqueue_job_finish_shape",
                condition=(
                    Q(state__in=["done", "dead", "cancelled"], finished_at__isnull=False)
                    | (~Q(state__in=["done", "dead", "cancelled"]) & Q(finished_at__isnull=True))
                ),
            ),
            models.CheckConstraint(
                name="jobqueue_job_state_valid",
                condition=Q(
                    state__in=[
                        "waiting",
                        "scheduled",
                        "ready",
                        "leased",
                        "running",
                        "done",
                        "dead",
                        "cancelled",
                    ]
                ),
            ),
            models.CheckConstraint(
                name="jobqueue_job_attempts_gte_0", condition=Q(attempts__gte=0)
            ),
            models.CheckConstraint(
                name="jobqueue_job_max_attempts_gt_0", condition=Q(max_attempts__gt=0)
            ),
            models.CheckConstraint(name="jobqueue_job_weight_gt_0", condition=Q(weight__gt=0)),
            models.UniqueConstraint(
                fields=["unique_key", "unique_slot"], name="jobqueue_job_unique_key_live"
            ),
            models.CheckConstraint(
                name="jobqueue_job_timeout_gt_0",
                condition=Q(timeout__isnull=True) | Q(timeout__gt=0),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.type} #{self.pk} ({self.state})"

    @property
    def is_terminal(self) -> bool:
        """Whether the job reached a final state."""
        return self.state in self.TERMINAL_STATES

    @property
    def in_graph(self) -> bool:
        """`in_graph()` of the row as it is here."""
        return in_graph(self)

    @property
    def timeout_delta(self) -> dt.timedelta | None:
        """The timeout as a timedelta, or None."""
        return None if self.timeout is None else dt.timedelta(seconds=self.timeout)


class JobDependency(models.Model):
    """An edge of the dependency graph: `job` runs only after `depends_on` is done.

    An `awaits` edge (ctx.wait_for) waits for `depends_on` to be final, whatever its state:
    its failure does not cancel `job`, whose handler learns of it when it resumes.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="upstream_edges")
    depends_on = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="downstream_edges")
    awaits = models.BooleanField(_("awaits"), default=False)

    class Meta:
        verbose_name = _("job dependency")
        verbose_name_plural = _("job dependencies")
        constraints = [
            models.UniqueConstraint(fields=["job", "depends_on"], name="jobqueue_dep_unique"),
            models.CheckConstraint(
                name="jobqueue_dep_not_self", condition=~Q(job=models.F("depends_on"))
            ),
        ]

    def __str__(self) -> str:
        return f"{self.job_id} -> {self.depends_on_id}"


class JobSequence(models.Model):
    """A sequence with unfinished jobs: `head` is the one job of it released to run.

    Enqueuing into a sequence and releasing its next job both lock this row, so jobs join a
    sequence one at a time (their ids then rise in enqueue order) and exactly one is released.
    The row goes when the sequence has no unfinished job left; the next enqueue makes it again.
    """

    key = KeyField(_("sequence"), max_length=255, primary_key=True)
    # The id of the job that holds the sequence (not a foreign key: pruning deletes jobs in
    # bulk, and a head that is gone simply lets the next job go).
    head = models.BigIntegerField(_("head job"), null=True, blank=True)
    created_at = models.DateTimeField(_("created"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated"), auto_now=True)

    class Meta:
        verbose_name = _("sequence")
        verbose_name_plural = _("sequences")

    def __str__(self) -> str:
        return str(self.key)


class WorkerQuerySet(models.QuerySet["Worker"]):
    """Querysets whose methods name a worker's states."""

    def live(self) -> WorkerQuerySet:
        """Rows of workers not known to be gone (their heartbeat may still have lapsed)."""
        return self.filter(gone_at__isnull=True)

    def alive(self) -> WorkerQuerySet:
        """Rows of workers not gone whose heartbeat is current (database clock)."""
        return self.live().filter(expires_at__gt=DbNow())

    def gone(self) -> WorkerQuerySet:
        """Rows kept for the Workers page of workers that stopped or were found dead."""
        return self.filter(gone_at__isnull=False)


class Worker(models.Model):
    """A worker process, kept fresh by its heartbeat; kept a while as gone once it ends.

    The row is the worker's liveness: its heartbeat pushes `expires_at` forward and lists the
    jobs it holds in `job_ids`. A lease is reclaimed only from a worker whose row has expired
    (or that no longer lists the job), never because a job row could not be renewed. A worker
    that stops, or is found dead, gets `gone_at` (and an expired, empty row): every reader of
    liveness ignores such rows, which only the Workers page shows until they are swept.
    """

    id = KeyField(_("worker id"), max_length=255, primary_key=True)
    host = models.CharField(_("host"), max_length=255)
    pid = models.IntegerField(_("pid"))
    # Who its process is on its host (worker/processes.py): a worker of the same host proves
    # it gone by it. "" where it cannot be told, and in the rows of older releases (which
    # register rows without it: db_default, for rolling deploys).
    process_key = models.CharField(
        _("process"), max_length=255, blank=True, default="", db_default=""
    )
    queues = models.JSONField(_("queues"), default=list)
    concurrency = models.IntegerField(_("concurrency"))
    started_at = models.DateTimeField(_("started"))
    heartbeat_at = models.DateTimeField(_("last heartbeat"))
    lease_ttl = models.FloatField(_("lease TTL (seconds)"), default=30.0)
    expires_at = models.DateTimeField(_("expires"), null=True, blank=True)  # heartbeat + TTL
    job_ids = models.JSONField(_("jobs held"), default=list, blank=True)
    handlers = models.JSONField(_("handlers"), default=list, blank=True)  # the types it claims
    # The versions of each handler it has, for the keys with other than "" (versions.py);
    # NULL in the rows of the workers of a release before versions (they have "" only).
    handler_versions = models.JSONField(_("handler versions"), null=True, default=dict, blank=True)
    # When it stopped or was found dead (NULL while live), and how many of its jobs were taken
    # back by a reclaimer (a clean stop leaves none).
    gone_at = models.DateTimeField(_("gone at"), null=True, blank=True)
    # db_default: the workers of the release before register rows without it (rolling deploys).
    jobs_reclaimed = models.IntegerField(_("jobs reclaimed"), default=0, db_default=0)
    # Whether it records OpenTelemetry metrics: the queue gauges are read by one of these
    # (worker/gauges.py). db_default: a worker of the release before registers without it.
    metrics = models.BooleanField(_("records metrics"), default=False, db_default=False)

    objects = WorkerQuerySet.as_manager()

    class Meta:
        verbose_name = _("worker")
        verbose_name_plural = _("workers")

    def __str__(self) -> str:
        return str(self.id)


class Effect(models.Model):
    """An effect a handler committed, by key: what record_effect() checks before doing it again."""

    key = KeyField(_("key"), max_length=255, unique=True)
    created_at = models.DateTimeField(_("recorded"), auto_now_add=True)

    class Meta:
        verbose_name = _("effect")
        verbose_name_plural = _("effects")

    def __str__(self) -> str:
        return str(self.key)


class Limit(models.Model):
    """One resource of the limits engine ("openai", "tenant:42", and the derived "group:<name>"
    and "queue:<name>"): the row claims of jobs that use it lock, made on first use, and when
    it reopens after a `RateLimited`."""

    name = KeyField(_("resource"), max_length=255, primary_key=True)
    closed_until = models.DateTimeField(_("closed until"), null=True, blank=True)
    created_at = models.DateTimeField(_("first used"), auto_now_add=True)

    class Meta:
        verbose_name = _("limit")
        verbose_name_plural = _("limits")

    def __str__(self) -> str:
        return str(self.name)


class LimitSetting(models.Model):
    """A limit changed while workers run (`jobqueue_limits set`): it replaces the settings'
    entry of the same name (a resource, or a pattern ending in "*") until it is reset."""

    name = KeyField(_("limit"), max_length=255, primary_key=True)
    concurrency = models.IntegerField(_("concurrency"), null=True, blank=True)
    rate = models.CharField(_("rate"), max_length=40, blank=True, default="")
    updated_at = models.DateTimeField(_("changed"), auto_now=True)

    class Meta:
        verbose_name = _("limit setting")
        verbose_name_plural = _("limit settings")

    def __str__(self) -> str:
        return str(self.name)


class ResourceStart(models.Model):
    """`units` of a rate-limited resource started by one claim at `started_at` (database clock);
    rows older than the resource's window are deleted by later claims. The one window of every
    rate (limits/window.py): LIMITS' and RATE_LIMITS' ("group:<name>")."""

    class Kind(models.TextChoices):
        # At a claim's time, counted in windows MARGIN longer than the period (the handler
        # starts a little after its claim counted it):
        START = "start", _("started by a claim")  # the units of a job's `uses`
        BACK = "back", _("given back")  # a job handed back unstarted: its units, negative
        USETTLE = "usettle", _("uses settled")  # ctx.settle(resource): used minus counted
        # At a running job's time, counted in windows of the period:
        GRANT = "grant", _("granted")  # ctx.acquire()
        SETTLE = "settle", _("settled")  # ctx.settle(grant): used minus granted

    resource = KeyField(_("resource"), max_length=255)
    started_at = models.DateTimeField(_("started"))
    units = models.IntegerField(_("units"))
    kind = models.CharField(_("kind"), max_length=8, choices=Kind.choices, default=Kind.START)
    # A settlement's units used (its `units` are what it changed: used minus granted).
    used = models.IntegerField(_("used"), null=True, blank=True)

    class Meta:
        verbose_name = _("resource start")
        verbose_name_plural = _("resource starts")
        indexes = [
            models.Index(fields=["resource", "started_at"], name="jobqueue_resource_started")
        ]

    def __str__(self) -> str:
        return f"{self.resource} x{self.units} @ {self.started_at}"


class JobStep(models.Model):
    """What a durable call of a job's handler returned: a step's result, or a sleep, an event
    wait or a spawn (names starting with "@"), kept so that a later run returns it again.

    `seq` numbers the calls of one name within a run (1, 2, ...): a step called in a loop has
    one record per call; `place` numbers all the durable calls of a run. Written in the
    transaction of the step, fenced by the job's lease.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="steps")
    name = KeyField(_("name"), max_length=200)
    seq = models.IntegerField(_("call"), default=1)
    # The call's place in its run (1: the run's first durable call), which each replay checks;
    # NULL in the records written before places were (matched by name and call only).
    place = models.IntegerField(_("place"), null=True, blank=True)
    result = models.JSONField(_("result"), null=True, blank=True)
    attempt = models.IntegerField(_("attempt"))
    duration = models.FloatField(_("duration (seconds)"), null=True, blank=True)
    created_at = models.DateTimeField(_("recorded"), auto_now_add=True)

    class Meta:
        verbose_name = _("job step")
        verbose_name_plural = _("job steps")
        constraints = [
            models.UniqueConstraint(fields=["job", "name", "seq"], name="jobqueue_step_unique")
        ]

    def __str__(self) -> str:
        return f"{self.name} #{self.seq} of job {self.job_id}"


class JobLogLine(models.Model):
    """A line a handler logged through `ctx.logger`, kept with the attempt that logged it
    (joblogs.py): at most JOBQUEUE["JOB_LOG_MAX_LINES"] an attempt, deleted with the job."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="log_lines")
    # The attempt (Job.attempts when it ran): the runs of one attempt resumed after a sleep or
    # a wait share it.
    attempt = models.IntegerField(_("attempt"))
    level = models.SmallIntegerField(_("level"))  # logging's number: 20 INFO, 30 WARNING, ...
    logged_at = models.DateTimeField(_("logged at"))  # the worker's clock
    message = models.TextField(_("message"))

    class Meta:
        verbose_name = _("job log line")
        verbose_name_plural = _("job log lines")

    def __str__(self) -> str:
        return f"{self.level_name} of job {self.job_id} attempt {self.attempt}: {self.message}"

    @property
    def level_name(self) -> str:
        """The level's name ("INFO"; "Level 25" for a number logging has no name for)."""
        return logging.getLevelName(self.level)


class JobEvent(models.Model):
    """An event by key (`send_event`): the first payload sent wins.

    A row with `sent_at` NULL stands for jobs waiting on a key nothing was sent to yet: the
    sender and a job starting to wait both lock the key's row, so neither misses the other.
    """

    key = KeyField(_("key"), max_length=255, primary_key=True)
    payload = models.JSONField(_("payload"), null=True, blank=True)
    sent_at = models.DateTimeField(_("sent"), null=True, blank=True)
    created_at = models.DateTimeField(_("created"), auto_now_add=True)

    class Meta:
        verbose_name = _("job event")
        verbose_name_plural = _("job events")
        indexes = [models.Index(fields=["sent_at"], name="jobqueue_event_sent")]

    def __str__(self) -> str:
        return str(self.key)


class JobWait(models.Model):
    """A job suspended in `waiting` for an event (ctx.wait_for_event), until `until` at most;
    or, with `count`, for that many of the jobs it awaits to be final (ctx.wait_for(count=N),
    `key` empty)."""

    job = models.OneToOneField(Job, on_delete=models.CASCADE, primary_key=True, related_name="+")
    key = KeyField(_("event key"), max_length=255)
    until = models.DateTimeField(_("until"), null=True, blank=True)
    count = models.IntegerField(_("jobs to be final"), null=True, blank=True)

    class Meta:
        verbose_name = _("job wait")
        verbose_name_plural = _("job waits")
        indexes = [
            models.Index(fields=["key"], name="jobqueue_wait_key"),
            models.Index(fields=["until"], name="jobqueue_wait_until"),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} waits for {self.key}"


class JobMap(models.Model):
    """The children of one ctx.map() call of a job: their ids (`first_id` to `last_id`, in the
    order of the items), how many are unfinished, and the cap on how many run at once.

    The children after `released_through` wait (`waiting`, held back) until a child of the
    map finishes and leaves room under `concurrency`; `running` counts those let go and not
    final yet. Every write holds the mapping job's row locked (see maps.py).
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="+")
    seq = models.IntegerField(_("call"))  # the call number of its "@map" record
    type = KeyField(_("handler"), max_length=255)
    total = models.IntegerField(_("children"))
    concurrency = models.IntegerField(_("concurrency"), null=True, blank=True)
    first_id = models.BigIntegerField(_("first child"))
    last_id = models.BigIntegerField(_("last child"))
    released_through = models.BigIntegerField(_("released through"))
    running = models.IntegerField(_("running"))
    unfinished = models.IntegerField(_("unfinished"))

    class Meta:
        verbose_name = _("job map")
        verbose_name_plural = _("job maps")
        constraints = [
            models.UniqueConstraint(fields=["job", "seq"], name="jobqueue_map_job_seq"),
        ]

    def __str__(self) -> str:
        return f"map {self.seq} of job {self.job_id}: {self.total - self.unfinished}/{self.total}"


class LiveLease(Job):
    """Jobs a worker holds (leased or running): the admin's live-leases page."""

    class Meta:
        proxy = True
        default_permissions = ()  # Job's permissions guard these pages
        verbose_name = _("live lease")
        verbose_name_plural = _("live leases")


class DeadJob(Job):
    """Jobs that ended `dead` or `cancelled`: the admin's dead-jobs page."""

    class Meta:
        proxy = True
        default_permissions = ()  # Job's permissions guard these pages
        verbose_name = _("dead job")
        verbose_name_plural = _("dead jobs")


class QueueOverview(Job):
    """The queue at a glance: the admin's overview page (no rows of its own)."""

    class Meta:
        proxy = True
        default_permissions = ()  # Job's permissions guard these pages
        verbose_name = _("overview")
        verbose_name_plural = _("overview")


class ScheduleState(models.Model):
    """Where one schedule of JOBQUEUE["SCHEDULES"] stands: the last slot a worker dealt with.

    A worker takes a slot by moving `last_slot` forward with an UPDATE conditioned on the value
    it read, in the transaction that enqueues the slot's job: of workers racing for one slot,
    exactly one changes the row, so each slot is enqueued once however many workers run.
    """

    name = KeyField(_("schedule"), max_length=200, primary_key=True)
    last_slot = models.DateTimeField(_("last slot"))  # enqueued or skipped
    enqueued_slot = models.DateTimeField(_("last enqueued slot"), null=True, blank=True)
    job_id = models.BigIntegerField(_("last job"), null=True, blank=True)
    updated_at = models.DateTimeField(_("updated"), auto_now=True)
    # While paused, no worker enqueues its slots (a schedule of the settings or a row alike).
    # Defaults in the database too: the workers of the release before insert rows without it.
    paused = models.BooleanField(_("paused"), default=False, db_default=False)
    paused_at = models.DateTimeField(_("paused at"), null=True, blank=True)
    # The last job "run now" enqueued (outside the slots) and when.
    run_job_id = models.BigIntegerField(_("last run-now job"), null=True, blank=True)
    run_at = models.DateTimeField(_("last run now"), null=True, blank=True)

    class Meta:
        verbose_name = _("schedule")  # the admin's Schedules page lists the schedules
        verbose_name_plural = _("schedules")
        # The Schedules page's own actions, on any schedule (settings or row).
        permissions = [
            ("pause_schedule", _("Can pause and resume a schedule")),
            ("run_schedule", _("Can run a schedule now")),
        ]

    def __str__(self) -> str:
        return str(self.name)


class ScheduleDefinition(models.Model):
    """A schedule stored as a row (`jobqueue_schedules add`, the admin), beside those of
    JOBQUEUE["SCHEDULES"]: the same keys, checked by the same `schedules.parse()` before it is
    written. An empty or null column is a key not given. Workers re-read the rows every few
    seconds (worker/schedule_runner.py); where it stands is its ScheduleState row.
    """

    name = KeyField(_("name"), max_length=200, primary_key=True)
    handler = KeyField(_("handler"), max_length=200, blank=True, default="")
    task = models.CharField(_("task"), max_length=255, blank=True, default="")
    cron = models.CharField(_("cron"), max_length=200, blank=True, default="")
    every = models.PositiveIntegerField(_("every (seconds)"), null=True, blank=True)
    timezone = models.CharField(_("time zone"), max_length=100, blank=True, default="")
    args = models.JSONField(_("arguments"), default=dict, blank=True)
    queue = KeyField(_("queue"), max_length=100, null=True, blank=True)
    group = KeyField(_("group"), max_length=200, blank=True, default="")
    priority = models.IntegerField(_("priority"), default=0)
    catch_up = models.CharField(
        _("catch up"),
        max_length=10,
        default="once",
        choices=[("once", _("once: the latest missed slot")), ("skip", _("skip missed slots"))],
    )
    grace = models.FloatField(_("grace (seconds)"), default=60.0)
    uses = models.JSONField(_("uses"), null=True, blank=True)
    sequence = KeyField(_("sequence"), max_length=255, null=True, blank=True)
    sequence_on_failure = models.CharField(
        _("sequence on failure"), max_length=10, blank=True, default=""
    )
    created_at = models.DateTimeField(_("created"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated"), auto_now=True)

    class Meta:
        verbose_name = _("stored schedule")
        verbose_name_plural = _("stored schedules")

    def __str__(self) -> str:
        return str(self.name)


class QueueState(models.Model):
    """A queue's operator state: while `paused`, workers claim none of its jobs."""

    name = KeyField(_("queue"), max_length=100, primary_key=True)
    paused = models.BooleanField(_("paused"), default=False)
    paused_at = models.DateTimeField(_("paused at"), null=True, blank=True)

    class Meta:
        verbose_name = _("queue state")
        verbose_name_plural = _("queue states")

    def __str__(self) -> str:
        return f"{self.name} ({'paused' if self.paused else 'active'})"


class PausedResource(models.Model):
    """A paused resource ("tenant:42") or family of resources ("tenant:*"): workers start no
    job that uses one of them until it is resumed (`pausing.pause_resource`)."""

    name = KeyField(_("resource"), max_length=255, primary_key=True)
    paused_at = models.DateTimeField(_("paused at"), default=timezone.now)

    class Meta:
        verbose_name = _("paused resource")
        verbose_name_plural = _("paused resources")

    def __str__(self) -> str:
        return str(self.name)


class PausedWorkflow(models.Model):
    """A paused job and everything under it (a container's or a spawner's children, at any
    depth): workers start none of them until it is resumed (`pausing.pause_workflow`)."""

    job = models.OneToOneField(
        Job, on_delete=models.CASCADE, primary_key=True, related_name="+", verbose_name=_("job")
    )
    paused_at = models.DateTimeField(_("paused at"), default=timezone.now)

    class Meta:
        verbose_name = _("paused workflow")
        verbose_name_plural = _("paused workflows")

    def __str__(self) -> str:
        return f"workflow #{self.job_id}"


class MinuteCount(models.Model):
    """What one worker did in one minute (its clock): claims, outcomes, and the enqueue-to-start
    latency of its first attempts as counts per bucket of `metrics.LATENCY_BUCKETS`. Written
    by the worker's recorder every few seconds (the minute's totals so far); read by the
    admin's charts; kept two days."""

    minute = models.DateTimeField(_("minute"))
    worker = KeyField(_("worker"), max_length=255)
    started = models.IntegerField(_("started"), default=0)
    finished = models.IntegerField(_("finished"), default=0)
    failed = models.IntegerField(_("failed"), default=0)
    latency = models.JSONField(_("latency buckets"), default=list)

    class Meta:
        verbose_name = _("minute count")
        verbose_name_plural = _("minute counts")
        constraints = [
            models.UniqueConstraint(fields=["minute", "worker"], name="jobqueue_count_minute")
        ]

    def __str__(self) -> str:
        return f"{self.worker} @ {self.minute}"


class MinuteSpend(models.Model):
    """The units of one resource that one handler's jobs spent in one minute (database clock):
    started by claims, granted by `ctx.acquire()`, corrected by `ctx.settle()`. Written in the
    transaction of each (an upsert); read by the admin's Limits page; kept two days."""

    minute = models.DateTimeField(_("minute"))
    resource = KeyField(_("resource"), max_length=255)
    handler = KeyField(_("handler"), max_length=200)
    units = models.BigIntegerField(_("units"), default=0)

    class Meta:
        verbose_name = _("minute spend")
        verbose_name_plural = _("minute spends")
        constraints = [
            models.UniqueConstraint(
                fields=["minute", "resource", "handler"], name="jobqueue_spend_minute"
            )
        ]

    def __str__(self) -> str:
        return f"{self.handler} on {self.resource} @ {self.minute}: {self.units}"


class MinuteSample(models.Model):
    """The ready backlog of one queue at one minute, and its oldest ready job's age: sampled
    once a minute by one worker (the first to write the minute's rows); kept two days."""

    minute = models.DateTimeField(_("minute"))
    queue = KeyField(_("queue"), max_length=100)
    ready = models.IntegerField(_("ready"))
    oldest_ready = models.FloatField(_("oldest ready (seconds)"), null=True)

    class Meta:
        verbose_name = _("minute sample")
        verbose_name_plural = _("minute samples")
        constraints = [
            models.UniqueConstraint(fields=["minute", "queue"], name="jobqueue_sample_minute")
        ]

    def __str__(self) -> str:
        return f"{self.queue} @ {self.minute}: {self.ready} ready"


def in_graph(job: Any) -> bool:
    """Whether the job (a Job, or a `records.ClaimedJob`) has dependents, a container or
    children of its own: its end has the graph to move too, so the completer sends it straight
    to the finish's transaction rather than through the one-statement finish, which would
    leave it anyway."""
    return bool(job.has_dependents or job.has_children or job.parent_id is not None)
