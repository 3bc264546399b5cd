"""Assertions about the jobs in the queue: what was enqueued, with which arguments.

They read the job table (any state: a job that has run since still counts as enqueued), so
they work in any test that can see the rows, and with any way of enqueuing: `enqueue()`,
`graph()`, `enqueue_many()`, a Django task's `enqueue()`, a handler enqueuing more.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .. import conf, registry

if TYPE_CHECKING:
    from ..models import Job, JobQuerySet

__all__ = [
    "CapturedJobs",
    "assert_enqueued",
    "assert_not_enqueued",
    "capture_enqueued",
    "enqueued_jobs",
]

# Jobs a failure message lists at most.
SHOWN = 20


def _jobs(using: str | None = None) -> JobQuerySet:
    from ..models import Job

    return Job.objects.using(using or conf.get().database)


def _task_class() -> type | None:
    try:
        from django.tasks.base import Task
    except ImportError:  # Django < 6.0
        return None
    return Task


def _key(target: Any) -> tuple[str, bool]:
    """Return the handler key `target` names, and whether it is a Django task."""
    if isinstance(target, str):
        return target, False
    task_class = _task_class()
    if task_class is not None and isinstance(target, task_class):
        from ..backends import task_key

        task: Any = target
        return task_key(task.backend, task.module_path), True
    key = registry.key_of(target) if callable(target) else None
    if key is None:
        raise TypeError(
            f"{target!r} is not a handler key, a function registered with "
            "@jobqueue.handler, or a Django task."
        )
    return key, False


def _json(value: Any) -> Any:
    """`value` as it reads back from a JSON column (tuples become lists, and so on)."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return value


class _Match:
    """Which jobs an assertion is about: a type, its arguments, other fields."""

    def __init__(
        self,
        target: Any,
        args: Any,
        kwargs: dict[str, Any] | None,
        fields: dict[str, Any],
    ) -> None:
        self.key: str | None = None
        self.is_task = False
        if target is not None:
            self.key, self.is_task = _key(target)
        if self.is_task:
            if args is not None and (
                isinstance(args, dict | str) or not isinstance(args, Sequence)
            ):
                raise TypeError(
                    "For a Django task, args= is the list of positional arguments; pass the "
                    "keyword arguments as kwargs=."
                )
        elif kwargs is not None:
            raise TypeError(
                "kwargs= is for Django tasks; a handler's arguments are args= (a dict)."
            )
        self.args = None if args is None else _json(list(args) if self.is_task else args)
        self.kwargs = None if kwargs is None else _json(kwargs)
        fields = dict(fields)
        if "group" in fields:  # enqueue()'s name for the column
            fields["group_key"] = fields.pop("group")
        self.upstream = [_pk(j) for j in _as_list(fields.pop("depends_on", ()))]
        self.fields = fields

    def queryset(self, jobs: JobQuerySet) -> JobQuerySet:
        if self.key is not None:
            jobs = jobs.filter(type=self.key)
        if self.fields:
            jobs = jobs.filter(**self.fields)
        for pk in self.upstream:
            jobs = jobs.filter(upstream_edges__depends_on_id=pk)
        return jobs.order_by("pk")

    def matches(self, job: Job) -> bool:
        if self.is_task:
            payload = job.args if isinstance(job.args, dict) else {}
            if self.args is not None and payload.get("args") != self.args:
                return False
            return self.kwargs is None or payload.get("kwargs") == self.kwargs
        return self.args is None or job.args == self.args

    def find(self, jobs: JobQuerySet) -> list[Job]:
        return [job for job in self.queryset(jobs) if self.matches(job)]

    def describe(self, count: int | None = None, *, negative: bool = False) -> str:
        """E.g. "at least one job 'shop.x' with args={...}, queue='emails'"."""
        if negative:
            head = "no job"
        elif count is None:
            head = "at least one job"
        else:
            head = f"{count} job" if count == 1 else f"{count} jobs"
        if self.key is not None:
            head += f" {self.key!r}"
        parts: list[str] = []
        if self.args is not None:
            parts.append(f"args={self.args!r}")
        if self.kwargs is not None:
            parts.append(f"kwargs={self.kwargs!r}")
        parts += [f"{name}={value!r}" for name, value in self.fields.items()]
        if self.upstream:
            parts.append(f"depends_on={self.upstream!r}")
        return f"{head} with {', '.join(parts)}" if parts else head


def _as_list(value: Any) -> list[Any]:
    if isinstance(value, Iterable) and not isinstance(value, str | bytes):
        return list(value)
    return [value]


def _pk(job: Any) -> int:
    """The id of a Job, a job id, or a Django TaskResult (its id is the job's)."""
    if isinstance(job, int) and not isinstance(job, bool):
        return job
    pk = getattr(job, "pk", None)
    if pk is None and not hasattr(job, "pk"):
        pk = getattr(job, "id", None)  # a TaskResult
    if pk is None:
        raise ValueError(f"depends_on: {job!r} is not a saved job, a job id or a TaskResult")
    return int(pk)


def _listing(jobs: Sequence[Job], title: str, total: int | None = None) -> str:
    total = len(jobs) if total is None else total
    if not total:
        return f"{title}: none."
    lines = [f"{title} ({total}):"]
    for job in jobs[:SHOWN]:
        line = f"  #{job.pk} {job.type!r} args={job.args!r} queue={job.queue!r}"
        if job.priority:
            line += f" priority={job.priority}"
        if job.group_key:
            line += f" group={job.group_key!r}"
        if job.parent_id is not None:
            line += f" parent={job.parent_id}"
        lines.append(f"{line} state={job.state}")
    if total > SHOWN:
        lines.append(f"  ... and {total - SHOWN} more")
    return "\n".join(lines)


def _check_enqueued(jobs: JobQuerySet, match: _Match, count: int | None, scope: str) -> list[Job]:
    found = match.find(jobs)
    if (count is None and found) or (count is not None and len(found) == count):
        return found
    if found:
        listing = _listing(found, "Matching jobs")
    else:
        listing = _listing(list(jobs.order_by("pk")[:SHOWN]), "Jobs enqueued", jobs.count())
    raise AssertionError(
        f"Expected {match.describe(count)} {scope}, found {len(found)}.\n{listing}"
    )


def _check_not_enqueued(jobs: JobQuerySet, match: _Match, scope: str) -> None:
    found = match.find(jobs)
    if found:
        raise AssertionError(
            f"Expected {match.describe(negative=True)} {scope}, found {len(found)}.\n"
            + _listing(found, "Matching jobs")
        )


def enqueued_jobs(
    type: Any = None, args: Any = None, *, kwargs: dict[str, Any] | None = None, **fields: Any
) -> list[Job]:
    """Return the jobs in the queue that match, oldest first.

    Takes the same arguments as `assert_enqueued`; with none, returns every job.

    Args:
        type: A handler key, a function registered with `@jobqueue.handler`, or a Django
            task; None for any type.
        args: The job's arguments, compared whole (a dict for a handler; for a Django task,
            the list of positional arguments). None: not compared.
        kwargs: For a Django task, its keyword arguments, compared whole.
        **fields: More conditions, as `Job` field lookups (`queue="emails"`,
            `priority__gte=5`, `state="ready"`, `parent=box`); `group=` is accepted for
            `group_key`, and `depends_on=` (a job, an id, a Django TaskResult, or a list of
            them) matches jobs that depend on at least those jobs.

    Returns:
        The matching `Job` rows.
    """
    return _Match(type, args, kwargs, fields).find(_jobs())


def assert_enqueued(
    type: Any,
    args: Any = None,
    *,
    kwargs: dict[str, Any] | None = None,
    count: int | None = None,
    **fields: Any,
) -> list[Job]:
    """Assert that a job of `type` (with these arguments and fields) is in the queue.

    Jobs in every state count: one that has run since it was enqueued still matches.

    Args:
        type: A handler key, a function registered with `@jobqueue.handler`, or a Django task.
        args: The job's arguments, compared whole after a JSON round trip (a tuple equals a
            list): a dict for a handler; for a Django task, the list of positional arguments.
            None: any arguments.
        kwargs: For a Django task, its keyword arguments, compared whole. None: any.
        count: How many matching jobs there must be; None: at least one.
        **fields: More conditions, as in `enqueued_jobs` (`queue="emails"`, `group="acme"`,
            `depends_on=job`, `state="done"`, `run_after__isnull=False`, ...).

    Returns:
        The matching jobs, oldest first.

    Raises:
        AssertionError: No job matches (or not `count` of them); the message lists the jobs
            that were enqueued, or those that matched.
    """
    return _check_enqueued(_jobs(), _Match(type, args, kwargs, fields), count, "in the queue")


def assert_not_enqueued(
    type: Any, args: Any = None, *, kwargs: dict[str, Any] | None = None, **fields: Any
) -> None:
    """Assert that no job of `type` (with these arguments and fields) is in the queue.

    Args:
        type: A handler key, a function registered with `@jobqueue.handler`, or a Django task.
        args: As for `assert_enqueued`; None: a job of `type` with any arguments fails.
        kwargs: For a Django task, its keyword arguments.
        **fields: More conditions, as in `enqueued_jobs`.

    Raises:
        AssertionError: A job matches; the message lists the matching jobs.
    """
    _check_not_enqueued(_jobs(), _Match(type, args, kwargs, fields), "in the queue")


class CapturedJobs:
    """The jobs enqueued inside a `capture_enqueued()` block (see there).

    Iterating, `len()` and indexing give the jobs, oldest first, read from the database each
    time. The methods are `assert_enqueued` and `assert_not_enqueued` restricted to them.
    """

    def __init__(self, using: str) -> None:
        self.using = using
        self._after = self._last_id()
        self._until: int | None = None

    def _last_id(self) -> int:
        from django.db.models import Max

        last = _jobs(self.using).aggregate(last=Max("pk"))["last"]
        return int(last or 0)

    def _close(self) -> None:
        self._until = self._last_id()

    def queryset(self) -> JobQuerySet:
        """The captured jobs as a queryset (ordered by id)."""
        jobs = _jobs(self.using).filter(pk__gt=self._after)
        if self._until is not None:
            jobs = jobs.filter(pk__lte=self._until)
        return jobs.order_by("pk")

    @property
    def jobs(self) -> list[Job]:
        """The captured jobs, oldest first."""
        return list(self.queryset())

    def __iter__(self) -> Iterator[Job]:
        return iter(self.jobs)

    def __len__(self) -> int:
        return self.queryset().count()

    def __getitem__(self, index: int) -> Job:
        return self.jobs[index]

    def __repr__(self) -> str:
        return f"<CapturedJobs {[f'{j.type} #{j.pk}' for j in self.jobs]}>"

    def assert_enqueued(
        self,
        type: Any,
        args: Any = None,
        *,
        kwargs: dict[str, Any] | None = None,
        count: int | None = None,
        **fields: Any,
    ) -> list[Job]:
        """Like `assert_enqueued`, among the captured jobs only.

        Args:
            type: A handler key, a registered handler function, or a Django task.
            args: The arguments, as for `assert_enqueued`.
            kwargs: A Django task's keyword arguments.
            count: How many must match; None: at least one.
            **fields: More conditions, as in `enqueued_jobs`.

        Returns:
            The matching jobs, oldest first.

        Raises:
            AssertionError: No captured job matches (or not `count` of them).
        """
        match = _Match(type, args, kwargs, fields)
        return _check_enqueued(self.queryset(), match, count, "in the block")

    def assert_not_enqueued(
        self, type: Any, args: Any = None, *, kwargs: dict[str, Any] | None = None, **fields: Any
    ) -> None:
        """Like `assert_not_enqueued`, among the captured jobs only.

        Args:
            type: A handler key, a registered handler function, or a Django task.
            args: The arguments, as for `assert_enqueued`.
            kwargs: A Django task's keyword arguments.
            **fields: More conditions, as in `enqueued_jobs`.

        Raises:
            AssertionError: A captured job matches.
        """
        _check_not_enqueued(self.queryset(), _Match(type, args, kwargs, fields), "in the block")


@contextmanager
def capture_enqueued() -> Iterator[CapturedJobs]:
    """Capture the jobs enqueued inside a `with` block.

    The jobs are those created in the block by any means (`enqueue()`, `graph()`, a task's
    `enqueue()`, containers too), found by id: every job whose id is above the highest one
    when the block began, up to the highest one when it ended.

    Yields:
        A `CapturedJobs`: iterate it, take its `len()`, or call its `assert_enqueued()`.
    """
    captured = CapturedJobs(conf.get().database)
    try:
        yield captured
    finally:
        captured._close()
