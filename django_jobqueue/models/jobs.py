"""The job table and its edges: Job (its states and querysets), JobDependency, JobSequence."""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

from django.db import models
from django.db.models import Q
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


def in_graph(job: Any) -> bool:
    """Whether the job (a Job, or a `lease_results.ClaimedJob`) has dependents, a container or
    children of its own: its end has the graph to move too, so the completer sends it straight
    to the finish's transaction rather than through the one-statement finish, which would
    leave it anyway."""
    return bool(job.has_dependents or job.has_children or job.parent_id is not None)
