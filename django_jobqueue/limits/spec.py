"""The grammar of limits: JOBQUEUE["LIMITS"], the resources a job uses, and the resources the
engine derives from GROUP_LIMITS, QUEUE_LIMITS and RATE_LIMITS.

A resource is a name ("openai", "tenant:42"). JOBQUEUE["LIMITS"] maps a resource, or a
pattern ending in "*" ("tenant:*"), to its limits: `concurrency` (at most N units in flight,
summed over the leased and running jobs that use the resource) and `rate` ("N/s|m|h": at
most N units started in any sliding window of that length). Every resource a pattern matches
has limits of its own. A job names the resources it uses and the units of each
(`enqueue(uses=...)`), and starts only when each has room for them: see `limits.resources`
for how a claim decides. This module reads and checks the settings and `uses`; it touches no
table.

The older settings are shorthands for resources of the same engine (`derived`): a group of
GROUP_LIMITS or RATE_LIMITS is the resource "group:<name>", a queue of QUEUE_LIMITS the
resource "queue:<name>", and every job of that group or queue uses one unit of it, without
saying so in its `uses`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured

from ..exceptions import InvalidJobError
from ..validation import INT_MAX, name_problem

if TYPE_CHECKING:
    from ..conf import JobQueueSettings

RATE_PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_rate(group: Any, rate: Any, *, setting: str = "RATE_LIMITS") -> tuple[int, int]:
    """Return (starts, period in seconds) of a rate such as "60/m" (a RATE_LIMITS entry, or
    the rate of a LIMITS entry)."""
    text = rate.strip() if isinstance(rate, str) else ""
    count, _, period = text.partition("/")
    # isdecimal() and isascii(): "²".isdigit() is true, but int("²") raises ValueError.
    if (
        not (count.isascii() and count.isdecimal())
        or not 1 <= int(count) <= INT_MAX
        or period not in RATE_PERIODS
    ):
        raise ImproperlyConfigured(
            f"JOBQUEUE[{setting!r}][{group!r}] is {rate!r}; use 'N/s', 'N/m', 'N/h' or 'N/d' with "
            f"a whole N from 1 to {INT_MAX} (at most N starts in any window of that length)."
        )
    return int(count), RATE_PERIODS[period]


PERIOD_NAMES = {seconds: name for name, seconds in RATE_PERIODS.items()}


@dataclasses.dataclass(frozen=True)
class Spec:
    """The limits of one resource: a concurrency cap and a rate, either may be None."""

    concurrency: int | None = None
    rate: tuple[int, int] | None = None  # (units, period in seconds)

    def cap(self) -> int | None:
        """The most units one job may use: more could never start."""
        caps = [c for c in (self.concurrency, self.rate[0] if self.rate else None) if c]
        return min(caps) if caps else None

    def describe(self) -> dict[str, Any]:
        rate = None
        if self.rate:
            rate = f"{self.rate[0]}/{PERIOD_NAMES[self.rate[1]]}"
        return {"concurrency": self.concurrency, "rate": rate}


# The prefixes of the resources derived from GROUP_LIMITS, RATE_LIMITS and QUEUE_LIMITS.
GROUP = "group:"
QUEUE = "queue:"


def group_resource(group: str) -> str:
    """The resource a job of `group` uses one unit of (where a group limit governs it)."""
    return GROUP + group


def queue_resource(queue: str) -> str:
    """The resource a job of `queue` uses one unit of (where QUEUE_LIMITS governs it)."""
    return QUEUE + queue


def derived(settings: JobQueueSettings) -> dict[str, Spec]:
    """GROUP_LIMITS, RATE_LIMITS and QUEUE_LIMITS as resources: {"group:<g>" or "queue:<q>":
    Spec}, a group's cap and rate in one entry."""
    specs: dict[str, Spec] = {}
    for group, cap in settings.group_limits.items():
        specs[group_resource(group)] = Spec(concurrency=cap)
    for group, rate in settings.rate_limits.items():
        capped = specs.get(group_resource(group), Spec()).concurrency
        specs[group_resource(group)] = Spec(capped, parse_rate(group, rate))
    for queue, cap in settings.queue_limits.items():
        specs[queue_resource(queue)] = Spec(concurrency=cap)
    return specs


def parse_spec(name: Any, value: Any, where: str = "JOBQUEUE['LIMITS']") -> Spec:
    """Return the Spec of one LIMITS entry, or raise ImproperlyConfigured naming it."""
    problem = name_problem(name, 255, star="end")
    if problem:
        raise ImproperlyConfigured(
            f"{where}: a resource name (1 to 255 characters, no control characters; a '*' "
            f"only at the end, for a pattern) {problem}."
        )
    if not isinstance(value, dict) or not value or set(value) - {"concurrency", "rate"}:
        raise ImproperlyConfigured(
            f"{where}[{name!r}] must be a dict with 'concurrency' (N units in flight) and/or "
            f"'rate' ('N/s', 'N/m', 'N/h' or 'N/d'), not {value!r}."
        )
    concurrency = value.get("concurrency")
    if concurrency is not None and not valid_concurrency(concurrency):
        raise ImproperlyConfigured(
            f"{where}[{name!r}]['concurrency'] must be an integer from 1 to {INT_MAX}."
        )
    rate = value.get("rate")
    parsed = None if rate is None else parse_rate(name, rate, setting="LIMITS")
    return Spec(concurrency, parsed)


def valid_concurrency(value: Any) -> bool:
    """Whether `value` is a concurrency cap: a whole number from 1 to INT_MAX."""
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= INT_MAX


def parse_limits(raw: Any) -> dict[str, Spec]:
    """Return JOBQUEUE["LIMITS"] as {name or pattern: Spec}; ImproperlyConfigured (the first
    of `limits_problems`) if bad."""
    for problem in limits_problems(raw):
        raise ImproperlyConfigured(problem)
    return {name: parse_spec(name, value) for name, value in raw.items()}


def limits_problems(raw: Any) -> Iterator[str]:
    """Say what is wrong with JOBQUEUE["LIMITS"]: one message for each bad entry."""
    if not isinstance(raw, dict):
        yield (
            "JOBQUEUE['LIMITS'] must map resource names (or patterns ending in '*') to dicts "
            "such as {'concurrency': 2} or {'rate': '500/m'}."
        )
        return
    for name, value in raw.items():
        try:
            parse_spec(name, value)
        except ImproperlyConfigured as exc:
            yield str(exc)


def configured(settings: JobQueueSettings) -> dict[str, Spec]:
    """The settings' LIMITS, parsed once for each value of the setting."""
    return _parsed(json.dumps(settings.limits, sort_keys=True, default=str))


def every_limit(settings: JobQueueSettings) -> dict[str, Spec]:
    """Every resource and pattern the settings limit: LIMITS' entries and the derived ones."""
    return {**derived(settings), **configured(settings)}


@functools.lru_cache(maxsize=8)
def _parsed(text: str) -> dict[str, Spec]:
    return parse_limits(json.loads(text))


def find[V](name: str, specs: Mapping[str, V]) -> tuple[str, V] | None:
    """The entry of `specs` that governs resource `name`: its own, else the longest pattern
    (any mapping of names and patterns: OPENTELEMETRY's TOKEN_RESOURCES too)."""
    if name in specs:
        return name, specs[name]
    patterns = [e for e in specs if e.endswith("*") and name.startswith(e[:-1])]
    if not patterns:
        return None
    best = max(patterns, key=len)
    return best, specs[best]


def check_uses(
    uses: Any,
    specs: Mapping[str, Spec],
    in_force: Callable[[], Mapping[str, Spec]] | None = None,
) -> dict[str, int] | None:
    """Return `uses` if every resource it names has a limit and units that fit; else raise
    InvalidJobError (before anything is written).

    Units fit a resource's cap in `specs` (the settings), or, where they do not and
    `in_force` is given, its cap in force (`in_force()`: the settings with the live changes
    of `jobqueue_limits set`, read only then): a job waits out a cap lowered for a while, and
    may use what a raised one allows.
    """
    if uses is None:
        return None
    if not isinstance(uses, Mapping):
        raise InvalidJobError(f"uses must map resource names to units, not {uses!r}.")
    checked = {}
    live: Mapping[str, Spec] | None = None
    for name, units in uses.items():
        found = find(name, specs) if isinstance(name, str) else None
        if found is not None and name.endswith("*"):  # a pattern: not one resource
            raise InvalidJobError(
                f"uses: {name!r} is a pattern of JOBQUEUE['LIMITS'], not a resource: name the "
                f"resource it matches (for example {name[:-1] + '42'!r})."
            )
        problem = name_problem(name, 255, star="none")
        if problem:
            raise InvalidJobError(f"uses: not a resource: its name {problem}.")
        if found is None:
            known = ", ".join(sorted(specs)) or "none: JOBQUEUE['LIMITS'] is empty"
            raise InvalidJobError(
                f"uses: {name!r} is not a resource of JOBQUEUE['LIMITS'] (known: {known})."
            )
        if isinstance(units, bool) or not isinstance(units, int) or units < 1:
            raise InvalidJobError(f"uses: the units of {name!r} must be an integer >= 1.")
        cap = found[1].cap()
        if cap is not None and units > cap and in_force is not None:
            live = in_force() if live is None else live
            changed = find(name, live)
            live_cap = None if changed is None else changed[1].cap()
            cap = None if live_cap is None else max(cap, live_cap)  # None: no cap in force
        if cap is not None and units > cap:
            raise InvalidJobError(
                f"uses: {units} units of {name!r} could never start: its limit "
                f"({found[0]!r}) allows {cap}."
            )
        checked[name] = units
    return checked or None
