"""The graph builder: many jobs, containers and edges written with a few bulk INSERTs."""

from __future__ import annotations

import dataclasses
import datetime as dt
import graphlib
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from django.db import transaction

from . import conf, registry, signals, validation
from .dialects import get_dialect
from .engine import dag, sequences, wake, workflows
from .engine.enqueuing import (
    CANCEL_FIELDS,
    JobRef,
    _build,
    cached_in_force,
    defaults,
    enqueue,
    job_from,
    mark_dependents,
    new_container,
    runnable_state,
)
from .exceptions import InvalidDependencyError, InvalidJobError
from .models import Job, JobDependency
from .options import JobOptions


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
        self.in_force = cached_in_force(self.settings)  # read once for the graph, if at all
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
        uses: Mapping[str, int] | None = None,
        sequence: str | None = None,
        sequence_on_failure: str | None = None,
    ) -> Job:
        """Add a job; see `enqueue` for the arguments (run_after takes a datetime here).

        The graph's jobs join their sequences in the order they were added.
        """
        if isinstance(run_after, dt.timedelta):
            raise InvalidJobError(
                "Graph.add() takes run_after as a datetime: the jobs of a graph are written "
                "together, so compute the time once (timezone.now() + delay)."
            )
        job, _ = _build(type, args, JobOptions.pick(locals()), self.settings, self.in_force)
        return self._add(job, list(depends_on), parent)

    def container(
        self,
        name: str,
        *,
        group: str = "",
        parent: JobRef | None = None,
        queue: str | None = None,
    ) -> Job:
        """Add a container; it is sealed when the graph is saved.

        As with `jobqueue.container()`, `group` and `queue` are the container row's own
        (``None``: ``JOBQUEUE["DEFAULT_QUEUE"]``); its children take the ones they are given.
        """
        options = JobOptions(group=group, queue=queue)
        box = new_container(name, options, sealed=True, settings=self.settings)
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
        external_up = dag.job_ids(
            [r for n in self._nodes for r in n.upstream if not self._is_new(r)], using, "depends_on"
        )
        external_parents = dag.job_ids(
            [n.parent for n in self._nodes if n.parent is not None and not self._is_new(n.parent)],
            using,
            "parent",
        )

        def txn() -> None:
            for node in self._nodes:  # a retried attempt inserts afresh
                node.job.pk = None
                node.job._state.adding = True
            states = dag.check_refs(using, external_up, None, lock=True)
            for parent_id in external_parents:
                dag.check_refs(using, [], parent_id, lock=True)
            self._check_acyclic(using, external_up, external_parents)
            heads = self._join_sequences(using)
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
                    held = job.sequence is not None and id(job) not in heads
                    job.state = (
                        Job.State.WAITING
                        if blocked or held or job.is_container
                        else runnable_state(job.run_after)
                    )
                    job.has_dependents = id(job) in upstream_of_others or held or id(job) in heads
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
            sequences.make_heads(
                get_dialect(using), {str(job.sequence): int(job.pk) for job in heads.values()}
            )
            mark_dependents(using, external_up)
            if any(s in Job.FAILED_STATES for s in states.values()):
                # Jobs downstream of an existing dead or cancelled job would wait forever:
                # they are cancelled in its name, as enqueue() does.
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

        # A savepoint in the caller's transaction (a bad reference leaves it usable); in its
        # own, retried whole (fix: workers lock the same rows in other orders, so the database
        # may fail it to break a deadlock).
        get_dialect(using).run_in_caller_transaction(txn)
        self.saved = True
        return [n.job for n in self._nodes]

    def _join_sequences(self, using: str) -> dict[int, Job]:
        """Lock the sequences of the graph's jobs (in key order); return {id(job): job} of
        the jobs to be their heads: the first added of each sequence that has none."""
        keys = sorted({n.job.sequence for n in self._nodes if n.job.sequence is not None})
        dialect = get_dialect(using)
        free = sequences.join(dialect, keys)
        heads: dict[int, Job] = {}
        for node in self._nodes:
            if node.job.sequence in free:
                free.discard(node.job.sequence)
                heads[id(node.job)] = node.job
        return heads

    def _check_acyclic(
        self, using: str, external_up: list[int], external_parents: list[int]
    ) -> None:
        """Reject a graph in which a job would wait, directly or not, for its own container.

        Nodes only name earlier nodes, but a container finishes after its children, so a
        child depending on its container (or on a job depending on it) would block both.
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
            for level in dag.waits_for(using, [parent_id]):
                for up in level & wanted:
                    after[("old", parent_id)].add(("old", up))
        sorter: graphlib.TopologicalSorter[tuple[str, int]] = graphlib.TopologicalSorter()
        for before, targets in after.items():
            for target in targets:
                sorter.add(target, before)
        try:
            sorter.prepare()
        except graphlib.CycleError as exc:
            by_key = {("new", id(n.job)): n.job for n in self._nodes}
            stuck = [by_key[k] for k in exc.args[1] if k in by_key]
            raise InvalidDependencyError(
                f"{stuck[0]!r} would wait for a container it belongs to (a cycle through "
                "depends_on and parent); a child cannot depend on its own container."
            ) from None

    def _is_new(self, ref: JobRef | None) -> bool:
        return isinstance(ref, Job) and id(ref) in self._known


def _ref_id(ref: JobRef) -> int:
    return int(ref.pk) if isinstance(ref, Job) else ref


def _bulk_insert(using: str, jobs: list[Job]) -> None:
    """Insert `jobs`, setting their primary keys (Dialect.insert_jobs: one INSERT where it
    can, in parts on MySQL/MariaDB to fit the server's packet size)."""
    get_dialect(using).insert_jobs(jobs)


@contextmanager
def graph() -> Iterator[Graph]:
    """Build a graph of jobs in the block; it is saved (one transaction) when the block exits."""
    builder = Graph()
    yield builder
    builder.save()


# The keyword arguments a spec of enqueue_many() may give (enqueue()'s, including parent and
# depends_on, which name existing jobs: the graph builder takes them too).
_SPEC_KEYS = frozenset({"type", "args", "depends_on", "parent"} | JobOptions.names())


def enqueue_many(specs: Iterable[tuple[str, dict[str, Any]] | dict[str, Any]]) -> list[Job]:
    """Enqueue jobs with bulk INSERTs; each spec is (type, args) or enqueue()'s keyword arguments.

    Every spec is checked before anything is written, and all are written in one transaction
    (the caller's, when one is open on the queue database). A spec with `unique_key` is
    written as enqueue() writes it: where an unfinished job holds the key, that job takes its
    place in the returned list.
    """
    if isinstance(specs, str | bytes | dict) or not isinstance(specs, Iterable):
        raise InvalidJobError(f"enqueue_many() takes a list of specs, not {specs!r}.")
    parsed = [_spec(i, spec) for i, spec in enumerate(specs)]
    if all(spec.keys() <= {"type", "args"} for spec in parsed):
        return _enqueue_plain(parsed)
    builder = Graph()
    plain: list[Job | None] = []
    for kwargs in parsed:
        if kwargs.get("unique_key") is None:
            kwargs.pop("unique_key", None)
            plain.append(builder.add(**kwargs))
        else:
            options = JobOptions.pick(kwargs)
            _build(kwargs["type"], kwargs.get("args"), options, builder.settings, builder.in_force)
            plain.append(None)
    if all(job is not None for job in plain):
        return builder.save()

    def write() -> list[Job]:
        builder.saved = False
        builder.save()
        return [
            job if job is not None else enqueue(**kwargs)
            for job, kwargs in zip(plain, parsed, strict=True)
        ]

    return get_dialect(builder.using).run_in_caller_transaction(write)


# The template of a type whose handler computes its jobs' `uses` from their args.
_EACH: dict[str, Any] = {}
# Per-job attributes that job_from() makes fresh and a template must not share between jobs.
_OWN = ("args", "errors", "worker_ids", "_state", "pk", "id")


def _enqueue_plain(specs: list[dict[str, Any]]) -> list[Job]:
    """enqueue_many() of jobs given by type and args only: ready, with every option default.

    Each type is validated once and its jobs are copies of that template with their own args;
    the graph builder's bookkeeping (levels, edges, containers) is skipped. A profile of a bulk
    enqueue showed that bookkeeping and the per-job option checks as most of its Python time.
    """
    settings = conf.get()
    in_force = cached_in_force(settings)
    templates: dict[Any, dict[str, Any]] = {}
    jobs = []
    for spec in specs:
        type_ = spec["type"]
        template = templates.get(type_) if isinstance(type_, str) else None
        if template is None:
            if isinstance(type_, str) and callable(registry.get(type_).uses):
                template = _EACH  # what it uses depends on its args: each job built in full
            else:
                job, _ = _build(type_, None, JobOptions(), settings, in_force)
                own = {k: v for k, v in job.__dict__.items() if k not in _OWN}
                template = {**defaults(), **own, "state": Job.State.READY}
            templates[type_] = template
        if template is _EACH:
            job, _ = _build(type_, spec.get("args"), JobOptions(), settings, in_force)
            job.state = Job.State.READY
            jobs.append(job)
            continue
        args = validation.check_args(type_, spec.get("args"), settings.max_args_bytes)
        jobs.append(job_from(template, args))
    using = settings.database

    def txn() -> None:
        for job in jobs:  # a retried attempt inserts afresh
            job.id = None
            job._state.adding = True
        _bulk_insert(using, jobs)
        for queue in {job.queue for job in jobs}:
            transaction.on_commit(lambda q=queue: wake.notify(using, q), using=using)  # type: ignore[misc]
        if signals.job_enqueued.receivers:
            transaction.on_commit(lambda: signals.send_enqueued(jobs), using=using)

    if jobs:
        get_dialect(using).run_in_caller_transaction(txn)
    return jobs


def _spec(index: int, spec: Any) -> dict[str, Any]:
    """Return the keyword arguments of spec number `index`, or raise InvalidJobError."""
    if isinstance(spec, tuple):
        if not 1 <= len(spec) <= 2:
            raise InvalidJobError(
                f"enqueue_many() spec {index}: a tuple is (type, args), not {len(spec)} items."
            )
        return {"type": spec[0], "args": spec[1] if len(spec) == 2 else None}
    if isinstance(spec, dict):
        unknown = sorted(str(k) for k in spec if k not in _SPEC_KEYS)
        if unknown:
            raise InvalidJobError(
                f"enqueue_many() spec {index}: unknown option(s) {', '.join(unknown)}; "
                f"known: {', '.join(sorted(_SPEC_KEYS))}."
            )
        if "type" not in spec:
            raise InvalidJobError(f"enqueue_many() spec {index} has no 'type'.")
        return dict(spec)
    raise InvalidJobError(
        f"enqueue_many() spec {index} must be a (type, args) tuple or a dict of enqueue() "
        f"options, not {type(spec).__name__}."
    )
