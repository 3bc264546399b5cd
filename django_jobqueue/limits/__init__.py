"""Limits built for quotas: one engine for every limit.

- `spec`: the grammar (JOBQUEUE["LIMITS"], `uses`, and the resources derived from
  GROUP_LIMITS, QUEUE_LIMITS and RATE_LIMITS); touches no table.
- `window`: the one sliding-window counter of every rate.
- `resources`: what a claim may start (each resource's room, its lock row).
- `live`: the changes operators make while workers run (`jobqueue_limits set`).
"""

from .spec import (
    GROUP,
    QUEUE,
    Spec,
    check_uses,
    configured,
    derived,
    every_limit,
    find,
    group_resource,
    limits_problems,
    parse_limits,
    parse_spec,
    queue_resource,
    valid_concurrency,
)

__all__ = [
    "GROUP",
    "QUEUE",
    "Spec",
    "check_uses",
    "configured",
    "derived",
    "every_limit",
    "find",
    "group_resource",
    "limits_problems",
    "parse_limits",
    "parse_spec",
    "queue_resource",
    "valid_concurrency",
]
