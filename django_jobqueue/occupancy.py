"""The limits of JOBQUEUE["LIMITS"] as operators see them and change them: what each holds
now (`jobqueue_limits`, the admin's Limits page), and the live changes workers pick up.

Reads only: the Limit rows (one per resource used so far), the jobs in flight (through the
leases' index), the rate windows, and the ready jobs that name a resource (at most
WAITING_SCAN of them are counted).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from . import conf, limits, quotas, validation
from .conf import parse_rate
from .dialects import Dialect
from .exceptions import InvalidJobError
from .models import Job, Limit, LimitSetting, ResourceStart
from .validation import INT_MAX

WAITING_SCAN = 100_000  # ready jobs with `uses` read to count the jobs waiting per resource


def current(dialect: Dialect) -> dict[str, limits.Spec]:
    """The settings' LIMITS with the live changes applied (as workers see them)."""
    return quotas.Resources(conf.get().limits).specs(dialect.using)


def occupancy(dialect: Dialect) -> list[dict[str, Any]]:
    """One entry per resource (each configured name, each resource used so far, each one a
    ready or running job uses): its limit, what it holds now and how many ready jobs wait
    for it; sorted by name."""
    using = dialect.using
    settings = limits.configured(conf.get())
    specs = current(dialect)
    changed = set(LimitSetting.objects.using(using).values_list("name", flat=True))
    rows = dict(Limit.objects.using(using).values_list("name", "closed_until"))
    now = dialect.now()
    in_flight: dict[str, int] = {}
    for uses in (
        Job.objects.using(using)
        .in_flight()
        .filter(uses__isnull=False)
        .values_list("uses", flat=True)
    ):
        for name, units in (uses or {}).items():
            in_flight[name] = in_flight.get(name, 0) + units
    waiting: dict[str, int] = {}
    ready = Job.objects.using(using).filter(state=Job.State.READY, uses__isnull=False)
    for uses in ready.values_list("uses", flat=True)[:WAITING_SCAN]:
        for name in uses or {}:
            waiting[name] = waiting.get(name, 0) + 1
    # A resource has its row from its first claim; one whose jobs wait or run has its entry
    # before that too.
    used = {name for name in {*in_flight, *waiting} if limits.find(name, specs)}
    names = sorted({*rows, *specs, *used})
    longest = max((s.rate[1] for s in specs.values() if s.rate), default=0)
    starts = ResourceStart.objects.using(using).filter(
        started_at__gt=now - dt.timedelta(seconds=longest + quotas.MARGIN)
    )
    recent = list(starts.values_list("resource", "started_at", "units"))
    entries = []
    for name in names:
        if name.endswith("*") and name in specs:  # a pattern: the sums of its resources
            entries.append(_pattern(name, specs, settings, changed, in_flight, waiting))
            continue
        found = limits.find(name, specs)
        entry, spec = found if found else (None, limits.Spec())
        started = None
        if spec.rate:
            window = now - dt.timedelta(seconds=spec.rate[1] + quotas.MARGIN)
            started = sum(u for r, at, u in recent if r == name and at > window)
        closed = rows.get(name)
        entries.append(
            {
                "name": name,
                "limit": entry,
                **spec.describe(),
                "in_flight": in_flight.get(name, 0),
                "started_in_window": started,
                "closed_until": closed.isoformat() if closed and closed > now else None,
                "waiting": waiting.get(name, 0),
                "changed": entry in changed,
                "settings": None
                if entry is None or entry not in settings
                else settings[entry].describe(),
            }
        )
    return entries


def set_limit(dialect: Dialect, name: str, *, concurrency: int | None, rate: str | None) -> None:
    """Change limit `name` (a LIMITS entry, or a resource an entry governs) while workers run;
    they apply it within about two seconds. What is not given keeps its value in force (the
    last change's, else the settings'). InvalidJobError for a bad name or value."""
    _known(name)
    found = limits.find(name, current(dialect))
    if found is not None:
        in_force = found[1].describe()
        concurrency = in_force["concurrency"] if concurrency is None else concurrency
        rate = in_force["rate"] if rate is None else rate
    value = {k: v for k, v in {"concurrency": concurrency, "rate": rate}.items() if v is not None}
    # Said in the command's words (the settings' check names JOBQUEUE['LIMITS']).
    if concurrency is not None and not limits.valid_concurrency(concurrency):
        raise InvalidJobError(
            f"The concurrency of {name!r} must be a whole number from 1 to {INT_MAX}, "
            f"not {concurrency!r}."
        )
    if rate is not None:
        try:
            parse_rate(name, rate, setting="LIMITS")
        except ImproperlyConfigured:
            raise InvalidJobError(
                f"The rate of {name!r} must be 'N/s', 'N/m' or 'N/h' with a whole N from 1 to "
                f"{INT_MAX}, not {rate!r}."
            ) from None
    try:
        limits.parse_spec(name, value)
    except ImproperlyConfigured as exc:
        raise InvalidJobError(str(exc)) from None
    LimitSetting.objects.using(dialect.using).update_or_create(
        name=name, defaults={"concurrency": concurrency, "rate": rate or ""}
    )


def reset_limit(dialect: Dialect, name: str) -> bool:
    """Go back to the settings' value of limit `name`; False if it was not changed.
    InvalidJobError if `name` is neither changed nor governed by JOBQUEUE["LIMITS"]."""
    check_name(name)
    deleted, _ = LimitSetting.objects.using(dialect.using).filter(name=name).delete()
    if not deleted:  # a change of a name the settings dropped since can still be undone
        _known(name)
    return bool(deleted)


def check_name(name: Any) -> str:
    """Return `name` if it may name a limit (a LIMITS entry, a pattern, or a resource);
    else raise InvalidJobError, before anything is read or written."""
    return validation.check_label("limit name", name, 255, star="end")


def _known(name: str) -> None:
    """Raise InvalidJobError unless an entry of JOBQUEUE["LIMITS"] governs `name`."""
    specs = limits.configured(conf.get())
    if limits.find(name, specs) is None:
        known = ", ".join(sorted(specs)) or "none"
        raise InvalidJobError(f"{name!r} is not a limit of JOBQUEUE['LIMITS'] (known: {known}).")


def reopen(dialect: Dialect, name: str) -> bool:
    """Open resource `name` again at once (after a `RateLimited`); False if it was not closed."""
    check_name(name)
    closed = Limit.objects.using(dialect.using).filter(name=name, closed_until__isnull=False)
    return bool(closed.update(closed_until=None))


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
        "closed_until": None,
        "waiting": sum(n for r, n in waiting.items() if mine(r)),
        "changed": name in changed,
        "settings": settings[name].describe() if name in settings else None,
    }
