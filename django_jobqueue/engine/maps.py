"""ctx.map(): one child job per item, at most `concurrency` of them running at once, and
their results in the order of the items.

The call writes every child in one transaction, fenced by the mapping job's lease, with the
bulk INSERTs of the graph builder (`Dialect.insert_jobs`), together with its "@map" record
(the children's id range) and a JobMap row that counts them: the first `concurrency`
children runnable, the others `waiting`, held back. A worker killed during it leaves
nothing, and the retry writes them all again: exactly one child per item. The job then
suspends (kind "map"), holding no lease and no place under any limit.

Each child of the map that becomes final counts itself down in the transaction of its final
state (`map_children.count_down`, called by workflows.roll_up), with the mapping job's row
locked: the next held children (by id: in item order) take its place under the cap, and the
last one makes the job runnable again. Its resumed run records the outcome on the "@map" record (the
first child that did not end `done`, and how many) and returns the results, read from the
children's rows; later runs read the same. The counts are taken anew from the children's
rows whenever the job suspends on its map or a child of it is retried, so a retried child
counts again.
"""

from __future__ import annotations

import copy
import datetime as dt
import functools
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from django.db import transaction

from .. import conf, registry, signals, validation
from ..exceptions import InvalidJobError, Suspend, UpstreamFailed
from ..models import Job, JobMap, JobStep
from ..options import JobOptions
from . import workflows
from .durable import MISSING, Plan, _next, fence, write
from .enqueuing import _build, cached_in_force, job_from
from .map_children import children, recount
from .replay import MAP

if TYPE_CHECKING:
    from .context import JobContext

# The options of enqueue() that a map's children cannot take: the parent is the mapping job,
# a held child must have nothing else to wait for, and one key for many jobs would keep one.
REFUSED = {
    "parent": "the mapping job is the parent",
    "depends_on": "a child waits only for room under the cap",
    "unique_key": "every child would share it",
}


def item_args(item: Any) -> Any:
    """The arguments of the child of `item`: a mapping is its keyword arguments; anything
    else is the one argument `item` (``{"item": item}``)."""
    return item if isinstance(item, Mapping) else {"item": item}


def check_concurrency(concurrency: Any) -> int | None:
    """`concurrency` checked: None (no cap of the map's own) or an integer >= 1."""
    if concurrency is None:
        return None
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise InvalidJobError(
            f"map: concurrency must be None or an integer >= 1, not {concurrency!r}"
        )
    return concurrency


def check_options(key: str | None, options: dict[str, Any]) -> tuple[str, JobOptions]:
    """The children's handler key and options; InvalidJobError for one they cannot take."""
    if "type" in options:  # enqueue()'s name for the key
        if key is not None:
            raise InvalidJobError("map() takes the handler key once: as `key` or as `type`")
        key = options.pop("type")
    if not isinstance(key, str):
        raise InvalidJobError(f"map() needs the children's handler key, not {key!r}")
    for name, why in REFUSED.items():
        if name in options:
            raise InvalidJobError(f"map() takes no {name}= ({why})")
    unknown = sorted(set(options) - JobOptions.names())
    if unknown:
        raise InvalidJobError(f"map() got unknown options {unknown}")
    if isinstance(options.get("run_after"), dt.timedelta):
        raise InvalidJobError(
            "map() takes run_after as a datetime: its children are written together, so "
            "compute the time once (timezone.now() + delay)"
        )
    return key, JobOptions(**options)


def build(key: str, items: list[Any], options: JobOptions) -> list[Job]:
    """The unsaved children of `items`, each checked (nothing is written)."""
    settings = conf.get()
    in_force = cached_in_force(settings)
    first, _ = _build(key, item_args(items[0]), options, settings, in_force)
    if callable(registry.get(key).uses):  # what each uses depends on its args
        rest = [_build(key, item_args(item), options, settings, in_force)[0] for item in items[1:]]
        return [first, *rest]
    own = ("args", "errors", "worker_ids", "_state", "pk", "id")
    template = {k: v for k, v in first.__dict__.items() if k not in own}
    most = settings.max_args_bytes
    return [first] + [
        job_from(template, validation.check_args(key, item_args(item), most)) for item in items[1:]
    ]


def map_plan(
    ctx: JobContext,
    key: str | None,
    items: Iterable[Any],
    concurrency: int | None,
    options: dict[str, Any],
) -> Plan[list[Any]]:
    """ctx.map(): the children's results in item order once all are final, or suspend."""
    cap = check_concurrency(concurrency)
    key, job_options = check_options(key, dict(options))
    if isinstance(items, str | bytes | Mapping) or not isinstance(items, Iterable):
        raise InvalidJobError(f"map() takes a list of items, not {items!r}")
    items = list(items)
    if not items:
        return []
    seq, found = yield from _next(ctx, MAP)
    if found is MISSING:
        yield functools.partial(_spawn, ctx, seq, key, items, job_options, cap)
        raise Suspend("map")
    if "failures" not in found:
        found = yield functools.partial(_close, ctx, seq, found)
        if found is None:
            raise Suspend("map")
    if found["failures"]:
        pk, state = found["failed"]
        raise UpstreamFailed(f"child job {pk} ended {state} (of {found['failures']} that did)")
    results: list[Any] = yield functools.partial(_results, ctx, found)
    return copy.deepcopy(results)


def _spawn(
    ctx: JobContext, seq: int, key: str, items: list[Any], options: JobOptions, cap: int | None
) -> dict[str, Any]:
    """Check and build the children of `items`, then write them, their JobMap row and the
    "@map" record, in one transaction fenced by the lease; return the record."""
    children = build(key, items, options)
    dialect, lease = ctx._dialect, ctx._lease
    using = dialect.using
    with dialect.step_transaction():
        fence(dialect, lease)
        for number, child in enumerate(children):
            child.pk = None  # a retried attempt inserts afresh
            child._state.adding = True
            child.parent_id = lease.job_id
            held = cap is not None and number >= cap
            child.state = Job.State.WAITING if held else _runnable(child)
        dialect.insert_jobs(children)
        ids = [int(child.pk) for child in children]
        if ids != sorted(ids):  # the dialects insert in order; the range relies on it
            raise RuntimeError(f"map: the children of job {lease.job_id} got ids out of order")
        running = len(ids) if cap is None else min(cap, len(ids))
        Job.objects.using(using).filter(pk=lease.job_id, has_children=False).update(
            has_children=True
        )
        JobMap.objects.using(using).create(
            job_id=lease.job_id,
            seq=seq,
            type=key,
            total=len(ids),
            concurrency=cap,
            first_id=ids[0],
            last_id=ids[-1],
            released_through=ids[running - 1],
            running=running,
            unfinished=len(ids),
        )
        found = {"type": key, "total": len(ids), "first": ids[0], "last": ids[-1]}
        write(ctx, MAP, seq, found, None)
        workflows.notify_on_commit(dialect, {child.queue for child in children[:running]})
        if signals.job_enqueued.receivers:
            transaction.on_commit(lambda: signals.send_enqueued(children), using=using)
    ctx._calls.remember(MAP, seq, found)
    return found


def _runnable(child: Job) -> str:
    from .enqueuing import runnable_state

    return runnable_state(child.run_after)


def _close(ctx: JobContext, seq: int, found: dict[str, Any]) -> dict[str, Any] | None:
    """Record the map's outcome if its children are all final (None if not: counted anew),
    in one transaction fenced by the lease."""
    dialect, lease = ctx._dialect, ctx._lease
    with dialect.step_transaction():
        fence(dialect, lease)
        if recount(dialect, lease.job_id, seq):
            return None
        kids = children(dialect, lease.job_id, found)
        failed = kids.exclude(state=Job.State.DONE).order_by("pk")
        first = failed.values_list("pk", "state").first()
        outcome = {**found, "failures": failed.count() if first else 0, "failed": first}
        rows = JobStep.objects.using(dialect.using)
        rows.filter(job_id=lease.job_id, name=MAP, seq=seq).update(result=outcome)
    ctx._calls.remember(MAP, seq, outcome)
    return outcome


def _results(ctx: JobContext, found: dict[str, Any]) -> list[Any]:
    kids = children(ctx._dialect, ctx.job_id, found).order_by("pk")
    results = list(kids.values_list("result", flat=True))
    if len(results) != found["total"]:
        raise InvalidJobError(
            f"map of job {ctx.job_id}: {found['total']} children were spawned but "
            f"{len(results)} are left (pruned?)"
        )
    return results
