"""Handler versions: which jobs a worker may claim, and the version a job's first claim gives it.

A job runs under the version of its handler that first ran it (`Job.handler_version`), so that
each replay meets the code that wrote its records. A job that no worker has started yet takes
the newest version of the worker that claims it (the one registered last): its first claim
writes it, in the claim's statement. A worker claims a started job only if it has that job's
version: one whose version no live worker has waits, as a job of an unknown handler does, and
`jobqueue_stats` counts it. ``""`` is the version of a handler registered without one, and of
every job started before versions existed.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from django.db.models import Case, CharField, Count, F, Q, QuerySet, Value, When

from . import registry

# (key, its versions, oldest first) of every key a process has: registry.served().
type Served = tuple[tuple[str, tuple[str, ...]], ...]

UNVERSIONED: tuple[str, ...] = ("",)


@functools.lru_cache(maxsize=16)
def claim_filter(served: Served) -> Q:
    """The jobs a worker of `served` may claim: its types, each started under a version it
    has, or not started yet (any version will do: its claim gives it the newest)."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for key, versions in served:
        groups.setdefault(tuple(sorted(versions)), []).append(key)
    condition = Q()
    for versions, keys in sorted(groups.items()):
        # A job not started yet has "" (its first claim writes its version).
        if versions == UNVERSIONED:
            condition |= Q(type__any_of=keys, handler_version="")
            continue
        allowed = Q(handler_version__any_of=list(versions))
        if "" not in versions:
            allowed |= Q(handler_version="", first_started_at__isnull=True)
        condition |= Q(type__any_of=keys) & allowed
    return condition


@functools.lru_cache(maxsize=16)
def newest(served: Served) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(version, keys) of each newest version other than "" in `served`: what a first claim
    writes into a job of those keys (the others keep "")."""
    keys: dict[str, list[str]] = {}
    for key, versions in served:
        if versions[-1]:
            keys.setdefault(versions[-1], []).append(key)
    return tuple((version, tuple(names)) for version, names in sorted(keys.items()))


def first_version(served: Served) -> Case | None:
    """The claim's new `handler_version` (an ORM expression): the newest of the worker's
    versions for a job not started yet, the job's own otherwise. None: nothing to write."""
    pinned = newest(served)
    if not pinned:
        return None
    return Case(
        *(
            When(Q(type__in=keys, first_started_at__isnull=True), then=Value(version))
            for version, keys in pinned
        ),
        default=F("handler_version"),
        output_field=CharField(),
    )


def newest_of(served: Served, key: str) -> str:
    """The version a first claim of a job of `key` gives it."""
    return next((version for version, keys in newest(served) if key in keys), "")


def worker_row(served: Served) -> dict[str, list[str]]:
    """What a worker's row says of its versions: those of each key that has other than ""
    (a key it lists in `handlers` and not here has "" only)."""
    return {key: list(versions) for key, versions in served if versions != UNVERSIONED}


def live_versions(rows: Iterable[tuple[Any, Any]]) -> dict[str, set[str]]:
    """{key: the versions some worker has} from workers' (handlers, handler_versions)."""
    have: dict[str, set[str]] = {}
    for handlers, versions in rows:
        for key in handlers or []:
            have.setdefault(key, set()).update((versions or {}).get(key, UNVERSIONED))
    return have


def unserved(jobs: QuerySet[Any], have: dict[str, set[str]] | None) -> dict[str, dict[str, int]]:
    """Count the runnable jobs, by type and version, that wait for a version no live worker
    has, of types that some has (the others are unknown handlers: `stats.unhandled`).

    `have`: the live workers' versions (`live_versions`); None (no worker live): this
    process's own.
    """
    if have is None:
        have = {key: set(versions) for key, versions in registry.served()}
    counts: dict[str, dict[str, int]] = {}
    # One count per state, each through the state's index (as stats.unhandled's).
    for state in ("scheduled", "ready"):
        rows = (
            jobs.filter(state=state)
            .order_by()
            .values_list("type", "handler_version")
            .annotate(n=Count("pk"), started=Count("pk", filter=Q(first_started_at__isnull=False)))
        )
        for kind, version, n, started in rows:
            served = have.get(kind)
            if served is None or version in served:
                continue
            waiting = n if version else started  # a job not started yet takes any version
            if waiting:
                by_version = counts.setdefault(kind, {})
                by_version[version] = by_version.get(version, 0) + waiting
    return {kind: dict(sorted(v.items())) for kind, v in sorted(counts.items())}
