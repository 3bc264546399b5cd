"""JobOptions: the one definition of the options a job is enqueued with, and their checks.

Every entry point (enqueue(), enqueue_many(), Graph.add(), the Tasks backend, schedules) keeps
its explicit keyword arguments for readers and docs, and hands them here; a new option is a
field of JobOptions plus a keyword in those signatures.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Mapping
from typing import Any

from . import conf, limits, validation
from .exceptions import InvalidJobError


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class JobOptions:
    """How a job runs: its group, weight, priority, queue, time, attempts, timeout, key, the
    resources it uses and the sequence it belongs to."""

    group: str = ""
    weight: int = 1
    priority: int = 0
    queue: str | None = None
    run_after: dt.datetime | dt.timedelta | None = None
    max_attempts: int | None = None
    timeout: float | dt.timedelta | None = None
    unique_key: str | None = None
    uses: Mapping[str, int] | None = None
    sequence: str | None = None
    sequence_on_failure: str | None = None

    @classmethod
    def names(cls) -> frozenset[str]:
        """Return the option names (the keyword arguments an entry point passes on)."""
        return frozenset(f.name for f in dataclasses.fields(cls))

    @classmethod
    def pick(cls, arguments: Mapping[str, Any]) -> JobOptions:
        """Return the options among `arguments` (an entry point's locals()), others at default."""
        return cls(**{name: arguments[name] for name in cls.names() if name in arguments})

    def as_kwargs(self) -> dict[str, Any]:
        """Return the options as enqueue() keyword arguments."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def sequence_fields(self, settings: conf.JobQueueSettings) -> dict[str, Any]:
        """Check `sequence` and `sequence_on_failure`; return their Job field values.

        A sequenced job is marked as having dependents: its end has its sequence to move, so
        it takes the finish's full transaction (see `models.in_graph`).
        """
        on_failure = validation.check_choice(
            "sequence_on_failure",
            settings.sequence_on_failure
            if self.sequence_on_failure is None
            else self.sequence_on_failure,
            conf.SEQUENCE_ON_FAILURE,
        )
        if self.sequence is None:
            if self.sequence_on_failure is not None:
                raise InvalidJobError("sequence_on_failure is given without a sequence.")
            return {}
        return {
            "sequence": validation.check_label("sequence", self.sequence, 255),
            "sequence_blocks": on_failure == "block",
            "has_dependents": True,
        }

    def job_fields(
        self,
        settings: conf.JobQueueSettings | None = None,
        in_force: Callable[[], Mapping[str, limits.Spec]] | None = None,
    ) -> tuple[dict[str, Any], dt.datetime | dt.timedelta | None]:
        """Check every option; return the Job field values and run_after (absolute or relative).

        Unset options take the JOBQUEUE settings' defaults. Raises InvalidJobError (a
        ValueError) naming the first bad option. `in_force`: the limits in force, read when
        `uses` exceeds a cap of the settings (`limits.check_uses`).
        """
        settings = settings or conf.get()
        fields = {
            "group_key": validation.check_label("group", self.group, 200, allow_empty=True),
            "weight": validation.check_positive_int("weight", self.weight),
            "priority": validation.check_int("priority", self.priority),
            "queue": validation.check_label(
                "queue", settings.default_queue if self.queue is None else self.queue, 100
            ),
            "max_attempts": validation.check_positive_int(
                "max_attempts",
                settings.max_attempts if self.max_attempts is None else self.max_attempts,
            ),
            "timeout": validation.check_timeout(
                settings.timeout if self.timeout is None else self.timeout
            ),
            "unique_key": None
            if self.unique_key is None
            else validation.check_label("unique_key", self.unique_key, 255),
            "uses": limits.check_uses(self.uses, limits.configured(settings), in_force),
            **self.sequence_fields(settings),
        }
        return fields, validation.check_run_after(self.run_after)
