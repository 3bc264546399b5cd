"""Handlers of the bad names' tests (tests/enqueue/test_bad_names_are_refused.py): each hands a bad
name, chosen by `case` (a lone surrogate cannot travel in a job's JSON arguments), to one
durable call or to `uses`."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.test.utils import CaptureQueriesContext

import django_jobqueue as jobqueue

# Names no column takes: each refused wherever a name or key reaches the database.
BAD_NAMES = {
    "lone-surrogate": "tenant:\ud800",
    "escape": "tenant:\x1b[2J",
    "newline": "tenant:1\nforged",
    "nul": "tenant:\x00",
    "bidi-override": "tenant:\u202e1",
    "empty": "",
    "too-long": "tenant:" + "9" * 300,
}
# A resource name with a "*" inside: never a resource, and a pattern only where it ends one.
INNER_STAR = {"inner-star": "tenant:4*2"}
RESOURCE_NAMES = {**BAD_NAMES, **INNER_STAR}

WRITES = {"INSERT", "UPDATE", "DELETE", "REPLACE"}
CALLS = {
    "step": lambda ctx, name: ctx.step(name, int),
    "wait_for_event": lambda ctx, name: ctx.wait_for_event(name),
    "spawn-uses": lambda ctx, name: ctx.spawn("test.noop", uses={name: 1}),
    "spawn-queue": lambda ctx, name: ctx.spawn("test.noop", queue=name),
    "spawn-group": lambda ctx, name: ctx.spawn("test.noop", group=name),
    "spawn-unique_key": lambda ctx, name: ctx.spawn("test.noop", unique_key=name),
    "spawn-key": lambda ctx, name: ctx.spawn(name),
}


@jobqueue.handler("names.durable_call", takes_context=True)
def durable_call(ctx: jobqueue.JobContext, call: str, case: str) -> dict[str, Any]:
    """Make durable call `call` with bad name `case`; say how it was refused, if it was, and
    which statements that wrote it sent (a read, such as the lease's fence, may come first)."""
    with CaptureQueriesContext(connection) as seen:
        try:
            CALLS[call](ctx, RESOURCE_NAMES[case])
        except jobqueue.InvalidJobError as exc:
            refused = {"refused": type(exc).__name__, "message": str(exc)}
        else:
            refused = {"refused": None}
    writes = [q["sql"] for q in seen.captured_queries if q["sql"].split()[0].upper() in WRITES]
    return {**refused, "writes": writes}


@jobqueue.handler("names.default_uses", uses=lambda args: {RESOURCE_NAMES[args["case"]]: 1})
def default_uses(case: str) -> None:
    """A handler whose default `uses` names bad resource `case`."""
