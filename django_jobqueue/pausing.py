"""Pause: workers start no job of a paused queue, resource or workflow until it is resumed.

- a queue (QueueState rows): its jobs;
- a resource ("tenant:42") or a family of them ("tenant:*") (PausedResource rows): the jobs
  that use one of them (`uses`; "group:<name>" and "queue:<name>", the resources derived
  from GROUP_LIMITS and QUEUE_LIMITS, hold the jobs of that group or queue);
- a workflow (PausedWorkflow rows): a job and every job under it, its children and theirs
  (a container's, a spawner's), those enqueued after the pause included.

Each worker reads what is paused at most every FAIR_SHARE_REFRESH seconds (see
FairShare.paused_queues and FairShare.held) and leaves those jobs out of its claim, so a
pause takes effect within about that long; jobs already running finish as usual, and paused
jobs stay `ready` (or wherever they are), losing nothing. With nothing paused the claim is
the same statement as without the feature.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from django.db import transaction
from django.db.models import Q, TextField
from django.db.models.functions import Cast
from django.db.models.lookups import Contains
from django.utils import timezone

from . import conf, validation
from .exceptions import InvalidJobError
from .limits import GROUP, QUEUE
from .models import Job, PausedResource, PausedWorkflow, QueueState

# The most levels of containers under a paused workflow the workers look through.
WORKFLOW_DEPTH = 100


def pause_queue(name: str) -> bool:
    """Pause queue `name`; return False when it was paused already."""
    validation.check_label("queue", name, 100)
    using = conf.get().database
    states = QueueState.objects.using(using)
    with transaction.atomic(using=using):
        if states.filter(name=name, paused=False).update(paused=True, paused_at=timezone.now()):
            return True
        if states.filter(name=name).exists():
            return False
        created = states.bulk_create(
            [QueueState(name=name, paused=True, paused_at=timezone.now())],
            ignore_conflicts=True,
        )
        return bool(created)


def resume_queue(name: str) -> bool:
    """Resume queue `name`; return False when it was not paused."""
    validation.check_label("queue", name, 100)
    using = conf.get().database
    return bool(
        QueueState.objects.using(using)
        .filter(name=name, paused=True)
        .update(paused=False, paused_at=None)
    )


def paused_queues(using: str | None = None) -> tuple[str, ...]:
    """Return the names of the paused queues, sorted."""
    return tuple(
        QueueState.objects.using(using or conf.get().database)
        .filter(paused=True)
        .order_by("name")
        .values_list("name", flat=True)
    )


def check_resource(name: object) -> str:
    """Return `name` if it is a resource or a pattern ("tenant:*"); else raise InvalidJobError."""
    return validation.check_label("resource", name, 255, star="end")


def pause_resource(name: str) -> bool:
    """Pause resource `name`, or every resource a pattern ("tenant:*") matches: workers start
    no job that uses one (within FAIR_SHARE_REFRESH). Return False when it was paused already."""
    check_resource(name)
    using = conf.get().database
    rows = PausedResource.objects.using(using)
    with transaction.atomic(using=using):
        if rows.filter(name=name).exists():
            return False
        rows.bulk_create([PausedResource(name=name)], ignore_conflicts=True)
        return True


def resume_resource(name: str) -> bool:
    """Resume resource (or pattern) `name`; return False when it was not paused."""
    check_resource(name)
    deleted, _ = PausedResource.objects.using(conf.get().database).filter(name=name).delete()
    return bool(deleted)


def paused_resources(using: str | None = None) -> tuple[str, ...]:
    """Return the paused resources and patterns, sorted."""
    rows = PausedResource.objects.using(using or conf.get().database).order_by("name")
    return tuple(rows.values_list("name", flat=True))


def job_id(job: Job | int) -> int:
    """The id of `job` (a saved Job, or an id in the column's range); else InvalidJobError."""
    pk = job.pk if isinstance(job, Job) else job
    if type(pk) is not int or not 1 <= pk <= validation.ID_MAX:  # no bool, no unsaved job
        raise InvalidJobError(f"Expected a saved job or an existing job's id, not {job!r}.")
    return pk


def pause_workflow(job: Job | int) -> bool:
    """Pause `job` and every job under it (children of a container or a spawner, at any depth,
    those enqueued later too): workers start none of them (within FAIR_SHARE_REFRESH). Return
    False when it was paused already; raise InvalidJobError for a job that does not exist."""
    pk = job_id(job)
    using = conf.get().database
    with transaction.atomic(using=using):
        if not Job.objects.using(using).filter(pk=pk).exists():
            raise InvalidJobError(f"Job {pk} does not exist.")
        rows = PausedWorkflow.objects.using(using)
        if rows.filter(job_id=pk).exists():
            return False
        rows.bulk_create([PausedWorkflow(job_id=pk)], ignore_conflicts=True)
        return True


def resume_workflow(job: Job | int) -> bool:
    """Resume workflow `job` (paused by `pause_workflow`); return False when it was not paused.
    Raise InvalidJobError for a job that does not exist."""
    pk = job_id(job)
    using = conf.get().database
    if not Job.objects.using(using).filter(pk=pk).exists():
        raise InvalidJobError(f"Job {pk} does not exist.")
    deleted, _ = PausedWorkflow.objects.using(using).filter(job_id=pk).delete()
    return bool(deleted)


def paused_workflows(using: str | None = None) -> tuple[int, ...]:
    """Return the ids of the jobs paused with `pause_workflow` (their workflows' tops), sorted."""
    rows = PausedWorkflow.objects.using(using or conf.get().database).order_by("job_id")
    return tuple(rows.values_list("job_id", flat=True))


@dataclasses.dataclass(frozen=True)
class Held:
    """What pauses of resources and workflows hold back: the paused resources and patterns,
    the paused workflows' tops, and `parents`, the jobs whose children are held (the tops and
    the unfinished containers and spawners under them)."""

    resources: tuple[str, ...] = ()
    tops: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.resources or self.tops)

    def condition(self, id_set: Callable[[Sequence[int]], Any] = list) -> Q:
        """The jobs held back, as a filter (the claim excludes them). `id_set`: the dialect's
        (`Dialect.id_set`), so that many parents are one parameter where the database allows."""
        held = Q(pk__in=self.tops) | Q(parent_id__in=id_set(self.parents)) if self.tops else Q()
        for name in self.resources:
            held |= _resource_condition(name)
        return held

    def why(self, job: Job) -> str | None:
        """Why `job` is held back by a pause (of a resource or workflow), or None."""
        if job.pk in self.tops:
            return f"workflow #{job.pk} is paused"
        if job.parent_id in self.parents:
            return "its workflow is paused"
        uses = job.uses if isinstance(job.uses, dict) else {}
        derived = [QUEUE + job.queue, *([GROUP + job.group_key] if job.group_key else [])]
        for name in self.resources:
            if any(matches(name, used) for used in [*uses, *derived]):
                return f"resource {name!r} is paused"
        return None


NOTHING_HELD = Held()


def matches(name: str, resource: str) -> bool:
    """Whether paused `name` (a resource, or a pattern ending in "*") covers `resource`."""
    return resource.startswith(name[:-1]) if name.endswith("*") else resource == name


def _resource_condition(name: str) -> Q:
    """The jobs that use resource `name`, or one its pattern matches (`uses`, or a derived
    "group:" or "queue:" resource)."""
    if not name.endswith("*"):
        held = Q(uses__has_key=name)
        if name.startswith(GROUP):
            held |= Q(group_key=name.removeprefix(GROUP))
        if name.startswith(QUEUE):
            held |= Q(queue=name.removeprefix(QUEUE))
        return held
    prefix = name[:-1]
    # A key of `uses` that starts with the prefix, read in the JSON text: `"tenant:` begins
    # a key (the values are whole numbers). The text is escaped as the database keeps it:
    # non-ASCII as \uXXXX where Django's json.dumps wrote it (SQLite, MariaDB), as itself
    # where the database rewrites it (PostgreSQL, MySQL): both are looked for.
    text = Cast("uses", TextField())
    needles = {json.dumps(prefix)[:-1], json.dumps(prefix, ensure_ascii=False)[:-1]}
    found = Q()
    for needle in sorted(needles):
        found |= Q(Contains(text, needle))
    held = Q(uses__isnull=False) & found
    # The derived resources "group:<name>" and "queue:<name>" the pattern matches: those of the
    # groups or queues it names, or all of them for a pattern shorter than the prefix ("*",
    # "gr*"), as `why()` (and so the admin) says.
    if prefix.startswith(GROUP) or GROUP.startswith(prefix):  # no group (group_key "") is none
        rest = prefix.removeprefix(GROUP) if prefix.startswith(GROUP) else ""
        held |= Q(group_key__startswith=rest) & ~Q(group_key="")
    if prefix.startswith(QUEUE) or QUEUE.startswith(prefix):
        rest = prefix.removeprefix(QUEUE) if prefix.startswith(QUEUE) else ""
        held |= Q(queue__startswith=rest)
    return held


def held(using: str | None = None) -> Held:
    """Read what the paused resources and workflows hold back now (two small reads, and with
    a workflow paused, one read per level of containers under it)."""
    using = using or conf.get().database
    tops = paused_workflows(using)
    return Held(paused_resources(using), tops, _parents(using, tops))


def _parents(using: str, tops: Iterable[int]) -> tuple[int, ...]:
    """`tops` and the unfinished jobs under them that have or may get children: containers,
    spawners, and the jobs running now (one that started before the pause may spawn or map
    later; one that has not started is held, and spawns nothing), through the parent index."""
    found = set(tops)
    frontier = list(found)
    for _ in range(WORKFLOW_DEPTH):
        if not frontier:
            break
        below = (
            Job.objects.using(using)
            .filter(parent_id__in=frontier)
            .filter(Q(is_container=True) | Q(has_children=True) | Q(lease_expires__isnull=False))
            .exclude(state__in=Job.TERMINAL_STATES)
            .values_list("pk", flat=True)
        )
        frontier = [pk for pk in below if pk not in found]
        found.update(frontier)
    return tuple(sorted(found))


def reasons(jobs: Iterable[Job], using: str | None = None) -> dict[int, str]:
    """Why each of `jobs` that has not started is held back by a pause, by job id (the
    admin's mark): a paused queue, resource or workflow. A few small reads for all of them."""
    waiting = [
        job
        for job in jobs
        if job.state not in Job.TERMINAL_STATES and job.state not in Job.LEASED_STATES
    ]
    if not waiting:
        return {}
    using = using or conf.get().database
    queues = set(paused_queues(using))
    now = held(using)
    found = {}
    for job in waiting:
        why = f"queue {job.queue!r} is paused" if job.queue in queues else now.why(job)
        if why:
            found[int(job.pk)] = why
    return found
