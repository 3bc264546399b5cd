"""The graph builder: many jobs, containers and edges written with a few bulk INSERTs."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connections, transaction

from . import conf, signals, validation, wake, workflows
from .dialects import get_dialect
from .enqueuing import (
    BAD_UPSTREAM,
    CANCEL_FIELDS,
    JobRef,
    _build,
    _check_refs,
    _ids,
    mark_dependents,
    runnable_state,
    waits_for,
)
from .exceptions import InvalidDependencyError
from .models import Job, JobDependency


@dataclasses.dataclass(eq=False)
class _Node:
    job: Job
    upstream: list[Job | int]
    parent: Job | int | None


class Graph:
    """Collects jobs and containers, then writes them all with a few bulk INSERTs.

    `add()` and `container()` return unsaved Job objects that later nodes may use in
    `depends_on` and `parent`; since a node can only name nodes created before it, the graph is
    acyclic by construction. `save()` validates every reference and writes everything in one
    transaction; the returned jobs have their primary keys.
    """

    def __init__(self) -> None:
        self.settings = conf.get()
        self.using = self.settings.database
        self._nodes: list[_Node] = []
        self._known: set[int] = set()  # id() of this graph's unsaved jobs
        self.saved = False

    def add(
        self,
        type: str,
        args: dict[str, Any] | None = None,
        *,
        depends_on: Iterable[JobRef] = (),
        parent: JobRef | None = None,
        group: str = "",
        weight: int = 1,
        priority: int = 0,
        queue: str | None = None,
        run_after: dt.datetime | None = None,
        max_attempts: int | None = None,
        timeout: float | dt.timedelta | None = None,
    ) -> Job:
        """Add a job; see `enqueue` for the arguments (run_after takes a datetime here)."""
        if isinstance(run_after, dt.timedelta):
            raise InvalidDependencyError("Graph.add() takes run_after as a datetime.")
        job, _ = _build(
            type, args, group=group, weight=weight, priority=priority, queue=queue,
            run_after=run_after, max_attempts=max_attempts, timeout=timeout,
            settings=self.settings,
        )  # fmt: skip
        return self._add(job, list(depends_on), parent)

    def container(self, name: str, *, group: str = "", parent: JobRef | None = None) -> Job:
        """Add a container; it is sealed when the graph is saved."""
        settings = conf.get()
        box = Job(
            type=validation.check_label("container name", name, 200),
            group_key=validation.check_label("group", group, 200, allow_empty=True),
            queue=settings.default_queue,
            is_container=True,
            sealed=True,
            max_attempts=1,
        )
        return self._add(box, [], parent)

    def _add(self, job: Job, upstream: list[JobRef], parent: JobRef | None) -> Job:
        if self.saved:
            raise InvalidDependencyError("This graph was saved already.")
        for ref in [*upstream, parent]:
            if isinstance(ref, Job) and ref.pk is None and id(ref) not in self._known:
                raise InvalidDependencyError(f"{ref!r} is neither saved nor part of this graph.")
        if isinstance(parent, Job) and id(parent) in self._known and not parent.is_container:
            raise InvalidDependencyError("parent: that job is not a container.")
        self._known.add(id(job))
        self._nodes.append(_Node(job, upstream, parent))
        return job

    def save(self) -> list[Job]:
        """Write the graph in one transaction and return its jobs, in the order added."""
        using = self.using
        external_up = _ids(
            [r for n in self._nodes for r in n.upstream if not self._is_new(r)], using, "depends_on"
        )
        external_parents = _ids(
            [n.parent for n in self._nodes if n.parent is not None and not self._is_new(n.parent)],
            using,
            "parent",
        )

        def txn() -> None:
            for node in self._nodes:  # a retried attempt inserts afresh
                node.job.pk = None
                node.job._state.adding = True
            states = _check_refs(using, external_up, None, lock=True)
            for parent_id in external_parents:
                _check_refs(using, [], parent_id, lock=True)
            self._check_acyclic(using, external_up, external_parents)
            levels: dict[int, list[_Node]] = {}
            depth: dict[int, int] = {}
            upstream_of_others = {id(r) for n in self._nodes for r in n.upstream if self._is_new(r)}
            # Containers are inserted sealed: each counts its children down as they finish.
            children: dict[int, int] = defaultdict(int)
            for node in self._nodes:
                if self._is_new(node.parent):
                    children[id(node.parent)] += 1
            for node in self._nodes:
                parent = node.parent
                level = depth[id(parent)] + 1 if self._is_new(parent) else 0
                depth[id(node.job)] = level
                levels.setdefault(level, []).append(node)
            for level in sorted(levels):
                batch = levels[level]
                for node in batch:
                    job = node.job
                    job.parent_id = None if node.parent is None else _ref_id(node.parent)
                    blocked = any(self._is_new(r) for r in node.upstream) or any(
                        states[_ref_id(r)] != Job.State.DONE
                        for r in node.upstream
                        if not self._is_new(r)
                    )
                    job.state = (
                        Job.State.WAITING
                        if blocked or job.is_container
                        else runnable_state(job.run_after)
                    )
                    job.has_dependents = id(job) in upstream_of_others
                    job.open_children = children.get(id(job), 0)
                _bulk_insert(using, [n.job for n in batch])
            JobDependency.objects.using(using).bulk_create(
                [
                    JobDependency(job_id=n.job.pk, depends_on_id=_ref_id(r))
                    for n in self._nodes
                    for r in dict.fromkeys(n.upstream)
                ],
                batch_size=1000,
            )
            mark_dependents(using, external_up)
            if any(s in BAD_UPSTREAM for s in states.values()):
                # Fix: jobs downstream of an existing dead or cancelled job used to wait
                # forever; they are cancelled in its name, as enqueue() does.
                cancelled = workflows.cancel_blocked(
                    get_dialect(using), [int(n.job.pk) for n in self._nodes if n.upstream]
                )
                for node in self._nodes:
                    if node.job.pk in cancelled:
                        node.job.refresh_from_db(using=using, fields=CANCEL_FIELDS)
            # Only a container without an unfinished child can roll up now (one that does, an
            # inner container say, rolls its parent up in turn): checking every container took
            # two statements each, more than the bulk INSERTs of a graph with many containers.
            busy = {
                id(n.parent)
                for n in self._nodes
                if self._is_new(n.parent) and n.job.state not in Job.TERMINAL_STATES
            }
            boxes = [n.job for n in self._nodes if n.job.is_container and id(n.job) not in busy]
            if boxes:
                dialect = get_dialect(using)
                for box in reversed(boxes):  # inner containers first
                    workflows.roll_up(dialect, int(box.pk), finished=0)
            for queue in {n.job.queue for n in self._nodes}:
                transaction.on_commit(lambda q=queue: wake.notify(using, q), using=using)  # type: ignore[misc]
            if signals.job_enqueued.receivers:
                saved = [n.job for n in self._nodes]
                transaction.on_commit(lambda: signals.send_enqueued(saved), using=using)

        if connections[using].in_atomic_block:
            with transaction.atomic(using=using):  # a savepoint: a bad reference leaves the
                txn()  # caller's transaction usable
        else:
            # Fix: the existing rows it locks are locked by workers too, in other orders, so
            # the database may fail this transaction to break a deadlock: retry it whole.
            get_dialect(using).run_in_transaction(txn)
        self.saved = True
        return [n.job for n in self._nodes]

    def _check_acyclic(
        self, using: str, external_up: list[int], external_parents: list[int]
    ) -> None:
        """Reject a graph in which a job would wait, directly or not, for its own container.

        Fix: nodes only name earlier nodes, but a container finishes after its children, so a
        child depending on its container (or on a job depending on it) deadlocked both.
        `after[a]` holds what cannot finish before `a` does; the graph must have no cycle.
        """
        after: dict[tuple[str, int], set[tuple[str, int]]] = defaultdict(set)

        def key(ref: JobRef) -> tuple[str, int]:
            return ("new", id(ref)) if self._is_new(ref) else ("old", _ref_id(ref))

        has_parent = False
        for node in self._nodes:
            me = ("new", id(node.job))
            after.setdefault(me, set())
            for ref in node.upstream:
                after[key(ref)].add(me)
            if node.parent is not None:
                after[me].add(key(node.parent))
                has_parent = True
        if not has_parent:
            return
        wanted = set(external_up)
        for parent_id in external_parents if wanted else []:
            for level in waits_for(using, [parent_id]):
                for up in level & wanted:
                    after[("old", parent_id)].add(("old", up))
        indegree: dict[tuple[str, int], int] = dict.fromkeys(after, 0)
        for targets in list(after.values()):
            for target in targets:
                indegree[target] = indegree.get(target, 0) + 1
        free = [k for k, n in indegree.items() if n == 0]
        while free:
            for target in after.get(free.pop(), ()):
                indegree[target] -= 1
                if indegree[target] == 0:
                    free.append(target)
        stuck = [n.job for n in self._nodes if indegree[("new", id(n.job))] > 0]
        if stuck:
            raise InvalidDependencyError(
                f"{stuck[0]!r} would wait for a container it belongs to (a cycle through "
                "depends_on and parent); a child cannot depend on its own container."
            )

    def _is_new(self, ref: JobRef | None) -> bool:
        return isinstance(ref, Job) and id(ref) in self._known


def _ref_id(ref: JobRef) -> int:
    return int(ref.pk) if isinstance(ref, Job) else ref


def _bulk_insert(using: str, jobs: list[Job]) -> None:
    """Insert `jobs`, setting their primary keys (one INSERT per 500 rows where possible)."""
    if connections[using].features.can_return_rows_from_bulk_insert:
        get_dialect(using).insert_jobs(jobs)
    else:  # MySQL returns no ids from a multi-row INSERT: insert one by one
        for job in jobs:
            job.save(using=using, force_insert=True)


@contextmanager
def graph() -> Iterator[Graph]:
    """Build a graph of jobs in the block; it is saved (one transaction) when the block exits."""
    builder = Graph()
    yield builder
    builder.save()


def enqueue_many(specs: Iterable[tuple[str, dict[str, Any]] | dict[str, Any]]) -> list[Job]:
    """Enqueue independent jobs with bulk INSERTs; each spec is (type, args) or enqueue kwargs."""
    builder = Graph()
    for spec in specs:
        if isinstance(spec, tuple):
            builder.add(*spec)
        else:
            builder.add(**spec)
    return builder.save()
