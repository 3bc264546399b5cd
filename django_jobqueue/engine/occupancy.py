"""Every limit as operators see it and change it: what each holds now (`jobqueue_limits`, the
admin's Limits page), whichever setting declared it (LIMITS, GROUP_LIMITS, RATE_LIMITS,
QUEUE_LIMITS), and the live changes workers pick up (`limits.live`).

Reads only: the Limit rows (one per resource used so far), the jobs in flight (through the
leases' index), the rate windows, and the ready jobs that name a resource (at most
WAITING_SCAN of them are counted) or belong to a limited group or queue.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db.models import Count, Sum

from .. import conf, limits
from ..dialects import Dialect
from ..limits import live, window
from ..limits.live import check_name, reopen
from ..limits.resources import Resources
from ..models import Job, Limit, LimitSetting, MinuteSpend

__all__ = ["check_name", "current", "occupancy", "reopen", "reset_limit", "set_limit"]

WAITING_SCAN = 100_000  # ready jobs with `uses` read to count the jobs waiting per resource


def current(dialect: Dialect) -> dict[str, limits.Spec]:
    """Every limit with the live changes applied (as workers see them)."""
    return Resources(conf.get()).specs(dialect.using)


def set_limit(dialect: Dialect, name: str, *, concurrency: int | None, rate: str | None) -> None:
    """Change limit `name` (an entry of the settings, or a resource an entry governs) while
    workers run; they apply it within about two seconds. What is not given keeps its value in
    force (the last change's, else the settings'). InvalidJobError for a bad name or value."""
    live.set_limit(
        dialect,
        name,
        concurrency=concurrency,
        rate=rate,
        settings=conf.get(),
        in_force=current(dialect),
    )


def reset_limit(dialect: Dialect, name: str) -> bool:
    """Go back to the settings' value of limit `name`; False if it was not changed.
    InvalidJobError if `name` is neither changed nor governed by a limit of the settings."""
    return live.reset_limit(dialect, name, conf.get())


def declared_by(name: str, entry: str | None) -> str | None:
    """The setting that declared limit `entry` (None: no setting governs it any more)."""
    settings = conf.get()
    if entry is None:
        return None
    if entry in limits.configured(settings):
        return "LIMITS"
    if entry.startswith(limits.QUEUE):
        return "QUEUE_LIMITS"
    group = entry[len(limits.GROUP) :]
    if group in settings.group_limits and group in settings.rate_limits:
        return "GROUP_LIMITS, RATE_LIMITS"
    return "RATE_LIMITS" if group in settings.rate_limits else "GROUP_LIMITS"


def occupancy(dialect: Dialect) -> list[dict[str, Any]]:
    """One entry per resource (each configured name, each resource used so far, each one a
    ready or running job uses, each limited group and queue): its limit and the setting that
    declared it, what it holds now and how many ready jobs wait for it; sorted by name."""
    using = dialect.using
    settings = limits.every_limit(conf.get())
    specs = current(dialect)
    changed = set(LimitSetting.objects.using(using).values_list("name", flat=True))
    rows = dict(Limit.objects.using(using).values_list("name", "closed_until"))
    now = dialect.now()
    in_flight = units_held(dialect, specs)
    waiting: dict[str, int] = {}
    ready = Job.objects.using(using).filter(state=Job.State.READY)
    for uses in ready.filter(uses__isnull=False).values_list("uses", flat=True)[:WAITING_SCAN]:
        for name in uses or {}:
            waiting[name] = waiting.get(name, 0) + 1
    _count_derived(ready, specs, waiting)
    # A resource has its row from its first claim; one whose jobs wait or run has its entry
    # before that too.
    used = {name for name in {*in_flight, *waiting} if limits.find(name, specs)}
    names = sorted({*rows, *specs, *used})
    periods = {n: found[1].rate[1] for n in names if (found := limits.find(n, specs))
               and found[1].rate and not n.endswith("*")}  # fmt: skip
    held = window.by_kind(dialect, periods)
    entries = []
    for name in names:
        if name.endswith("*") and name in specs:  # a pattern: the sums of its resources
            entries.append(_pattern(name, specs, settings, changed, in_flight, waiting))
            continue
        found = limits.find(name, specs)
        entry, spec = found if found else (None, limits.Spec())
        closed = rows.get(name)
        entries.append(
            {
                "name": name,
                "limit": entry,
                **spec.describe(),
                "in_flight": in_flight.get(name, 0),
                "started_in_window": held.get(name, {}).get("net", 0) if spec.rate else None,
                "granted_in_window": held.get(name, {}).get("granted", 0) if spec.rate else None,
                "settled_in_window": held.get(name, {}).get("settled", 0) if spec.rate else None,
                "closed_until": closed.isoformat() if closed and closed > now else None,
                "waiting": waiting.get(name, 0),
                "changed": entry in changed,
                "settings": None
                if entry is None or entry not in settings
                else settings[entry].describe(),
                "declared_by": declared_by(name, entry),
            }
        )
    return entries


def units_held(dialect: Dialect, specs: dict[str, limits.Spec]) -> dict[str, int]:
    """The units the jobs in flight hold of each resource: those their `uses` name, and one of
    a limited group's or queue's resource (`specs`: the limits in force)."""
    in_flight: dict[str, int] = {}
    jobs = Job.objects.using(dialect.using).in_flight()
    for uses in jobs.filter(uses__isnull=False).values_list("uses", flat=True):
        for name, units in (uses or {}).items():
            in_flight[name] = in_flight.get(name, 0) + units
    _count_derived(jobs, specs, in_flight)
    return in_flight


def _count_derived(jobs: Any, specs: dict[str, limits.Spec], into: dict[str, int]) -> None:
    """Add to `into` the derived resources `jobs` use: a job of a limited group or queue uses
    one unit of it."""
    for field, prefix in (("group_key", limits.GROUP), ("queue", limits.QUEUE)):
        limited = [name[len(prefix) :] for name in specs if name.startswith(prefix)]
        if not limited:
            continue
        counts = (
            jobs.filter(**{f"{field}__in": limited})
            .values_list(field)
            .annotate(n=Count("pk"))
            .values_list(field, "n")
        )
        for key, n in counts:
            into[prefix + key] = into.get(prefix + key, 0) + n


def holding(dialect: Dialect) -> dict[str, tuple[int, int | None]]:
    """What each limit holds now, for the OpenTelemetry limit gauges: {resource: (the units
    the jobs in flight hold, its concurrency in force or None)}. Every resource a limit names
    itself (an entry of LIMITS that is no pattern, a limited group or queue, a live change) is
    there, 0 when idle; a resource a pattern governs ("tenant:*") only while it holds
    something, so that ten thousand tenants are not ten thousand figures per read. Reads the
    jobs in flight (through the leases' index) and the live changes; no ready job, no window."""
    specs = current(dialect)
    in_flight = units_held(dialect, specs)
    found: dict[str, tuple[int, int | None]] = {}
    for name in sorted({*(n for n in specs if not n.endswith("*")), *in_flight}):
        governing = limits.find(name, specs)
        if governing is not None:
            found[name] = (in_flight.get(name, 0), governing[1].concurrency)
    return found


def spend(dialect: Dialect, minutes: int) -> list[dict[str, Any]]:
    """The units each handler spent of each resource over the last `minutes` minutes (claims'
    starts, grants, and their settlements), most first."""
    since = dialect.now() - dt.timedelta(minutes=minutes)
    rows = (
        MinuteSpend.objects.using(dialect.using)
        .filter(minute__gte=since.replace(second=0, microsecond=0))
        .values_list("resource", "handler")
        .annotate(n=Sum("units"))
        .values_list("resource", "handler", "n")
    )
    found = [{"resource": r, "handler": h, "units": int(n or 0)} for r, h, n in rows if n]
    return sorted(found, key=lambda e: (-e["units"], e["resource"], e["handler"]))


def _pattern(
    name: str,
    specs: dict[str, limits.Spec],
    settings: dict[str, limits.Spec],
    changed: set[str],
    in_flight: dict[str, int],
    waiting: dict[str, int],
) -> dict[str, Any]:
    """A pattern's row: its limits (each resource it matches has its own), and the units in
    flight and the jobs waiting summed over those resources."""

    def mine(resource: str) -> bool:
        found = limits.find(resource, specs)
        return found is not None and found[0] == name

    return {
        "name": name,
        "limit": name,
        **specs[name].describe(),
        "in_flight": sum(n for r, n in in_flight.items() if mine(r)),
        "started_in_window": None,
        "granted_in_window": None,
        "settled_in_window": None,
        "closed_until": None,
        "waiting": sum(n for r, n in waiting.items() if mine(r)),
        "changed": name in changed,
        "settings": settings[name].describe() if name in settings else None,
        "declared_by": declared_by(name, name),
    }
