"""What the lease transitions hand back: what a claim returns (ClaimedJob, light enough for the
worker's hot path) and what a batched finish did (Finished, FinishReport). Plain values passed
from the dialects up to the engine and the worker: this module imports only the models."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from collections.abc import Sequence
from typing import Any

from .models import Job, in_graph

# The columns a claim reads back: what running the job needs, and when it became due (the
# enqueue-to-start latency of metrics.py). A handler that takes a context gets a Job model
# instance with these loaded and the others deferred (read on first access).
# Whether the job is in a graph (see `in_graph`): read with the claim, but not taken into the
# handler's Job instance (they may change while it runs: deferred, read anew there).
_NOT_IN_MODEL = ("has_dependents", "has_children")
CLAIM_FIELDS = (
    "id",
    "type",
    "handler_version",
    "args",
    "state",
    "attempts",
    "max_attempts",
    "queue",
    "priority",
    "group_key",
    "parent_id",
    "timeout",
    "lease_owner",
    "has_steps",
    "created_at",
    "run_after",
    "traceparent",
    *_NOT_IN_MODEL,
)


class ClaimedJob:
    """A claimed job's row as the claim returned it (CLAIM_FIELDS), after the claim's writes.

    A plain object rather than a Job model instance: a profile of the drain showed building
    model instances as the worker's largest cost after the claim statement itself. `model()`
    gives the Job instance when a handler's context needs one. `records` holds its durable
    calls' records when the worker read them with the claim (`replay.preload`), else None,
    and `places` the calls at their places.
    """

    __slots__ = (*CLAIM_FIELDS, "_model", "using", "records", "places")

    id: int
    type: str
    handler_version: str
    args: dict[str, Any]
    state: str
    attempts: int
    max_attempts: int
    queue: str
    priority: int
    group_key: str
    parent_id: int | None
    timeout: float | None
    lease_owner: str | None
    has_steps: bool
    created_at: dt.datetime | None
    run_after: dt.datetime | None
    traceparent: str | None
    has_dependents: bool
    has_children: bool

    def __init__(self, using: str, values: Sequence[Any]) -> None:
        """Take the values of CLAIM_FIELDS, in that order."""
        self.using = using
        self.records: dict[tuple[str, int], Any] | None = None
        self.places: dict[int, tuple[str, int]] | None = None
        self._model: Job | None = None
        (
            self.id,
            self.type,
            self.handler_version,
            self.args,
            self.state,
            self.attempts,
            self.max_attempts,
            self.queue,
            self.priority,
            self.group_key,
            self.parent_id,
            self.timeout,
            self.lease_owner,
            self.has_steps,
            self.created_at,
            self.run_after,
            self.traceparent,
            self.has_dependents,
            self.has_children,
        ) = values

    @property
    def pk(self) -> int:
        return self.id

    @property
    def in_graph(self) -> bool:
        """`in_graph()` of the row as the claim read it."""
        return in_graph(self)

    def model(self) -> Job:
        """The Job model instance (deferred fields load on first access)."""
        if self._model is None:
            names = _model_order()
            self._model = Job.from_db(self.using, names, [getattr(self, n) for n in names])
        return self._model

    def __repr__(self) -> str:
        return f"<ClaimedJob {self.type} #{self.id} attempt {self.attempts}>"


@dataclasses.dataclass(frozen=True)
class Finished:
    """One row a batched finish wrote: its final state and what the graph must do about it."""

    job_id: int
    state: str  # "done", or "cancelled" when cancellation was requested while it ran
    parent_id: int | None
    has_dependents: bool
    has_children: bool = False  # it spawned jobs (ctx.spawn): it may have to wait for them


@dataclasses.dataclass
class FinishReport:
    """What a batched finish did with each (job id, attempt) it was given."""

    finished: list[Finished] = dataclasses.field(default_factory=list)
    busy: list[int] = dataclasses.field(default_factory=list)  # row locked elsewhere: try again
    lost: list[int] = dataclasses.field(default_factory=list)  # lease no longer ours
    # (job id, state) finished by this very lease before: an earlier write of the batch was
    # committed but its reply was lost. Recorded already, the graph has reacted already.
    recorded: list[tuple[int, str]] = dataclasses.field(default_factory=list)


@functools.cache
def _model_order() -> list[str]:
    """CLAIM_FIELDS in the Job model's field order, as Model.from_db takes them."""
    return [
        f.attname
        for f in Job._meta.concrete_fields
        if f.attname in CLAIM_FIELDS and f.attname not in _NOT_IN_MODEL
    ]
