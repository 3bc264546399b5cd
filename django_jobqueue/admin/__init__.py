"""The operators' admin: jobs, live leases, dead jobs, workers, limits, schedules, an overview,
actions.

Importing this package registers every page with the default admin site, and the handler of
the job that applies an action to a whole filtered list (bulk.py).
"""

from . import bulk  # noqa: F401  (registers bulk.BULK_HANDLER)
from .jobs import JobAdmin
from .limits import LimitAdmin
from .lists import DeadJobAdmin, LiveLeaseAdmin
from .overview import QueueOverviewAdmin
from .schedules import ScheduleAdmin
from .workers import WorkerAdmin

__all__ = [
    "DeadJobAdmin",
    "JobAdmin",
    "LimitAdmin",
    "LiveLeaseAdmin",
    "QueueOverviewAdmin",
    "ScheduleAdmin",
    "WorkerAdmin",
]
