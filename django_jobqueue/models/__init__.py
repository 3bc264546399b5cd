"""The queue's tables, one module per family; every model is importable from here, as
Django and the documented paths (`django_jobqueue.models.Job`, ...) expect.

- `jobs`: Job, JobDependency, JobSequence;
- `workers`: Worker;
- `durable`: what a long job keeps (steps, log lines, events, waits, maps, effects);
- `limits`: the limits engine's rows; `pauses`: paused queues, resources and workflows;
- `schedules`: schedule states and stored schedules; `metrics`: the per-minute figures;
- `admin_pages`: proxy models that give the admin pages of their own.

`fields`, `functions` and `indexes` are the model plumbing whose SQL differs per database.
"""

from .admin_pages import DeadJob, LiveLease, QueueOverview
from .durable import Effect, JobEvent, JobLogLine, JobMap, JobStep, JobWait
from .jobs import (
    READY_GROUP_INDEX,
    READY_QUEUE_INDEX,
    Job,
    JobDependency,
    JobQuerySet,
    JobSequence,
    in_graph,
)
from .limits import Limit, LimitSetting, ResourceStart
from .metrics import MinuteCount, MinuteHandlerCount, MinuteSample, MinuteSpend
from .pauses import PausedResource, PausedWorkflow, QueueState
from .schedules import ScheduleDefinition, ScheduleState
from .workers import Worker, WorkerQuerySet

__all__ = [
    "READY_GROUP_INDEX",
    "READY_QUEUE_INDEX",
    "DeadJob",
    "Effect",
    "Job",
    "JobDependency",
    "JobEvent",
    "JobLogLine",
    "JobMap",
    "JobQuerySet",
    "JobSequence",
    "JobStep",
    "JobWait",
    "Limit",
    "LimitSetting",
    "LiveLease",
    "MinuteCount",
    "MinuteHandlerCount",
    "MinuteSample",
    "MinuteSpend",
    "PausedResource",
    "PausedWorkflow",
    "QueueOverview",
    "QueueState",
    "ResourceStart",
    "ScheduleDefinition",
    "ScheduleState",
    "Worker",
    "WorkerQuerySet",
    "in_graph",
]
