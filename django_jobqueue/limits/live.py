"""The one path of live changes: a limit changed while workers run (`jobqueue_limits set`, the
admin's Limits page) is a `LimitSetting` row that replaces the settings' entry of the same name
until it is reset; each worker reads them at most every second (`Resources.specs`).

Any limit can be changed so: a LIMITS entry or a resource it governs, and the derived ones
("group:<name>" of GROUP_LIMITS or RATE_LIMITS, "queue:<name>" of QUEUE_LIMITS).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured

from .. import validation
from ..dialects import Dialect
from ..exceptions import InvalidJobError
from ..models import Limit, LimitSetting
from ..validation import INT_MAX
from .spec import Spec, every_limit, find, parse_rate, parse_spec, valid_concurrency

if TYPE_CHECKING:
    from ..conf import JobQueueSettings

# Seconds a worker reuses the live changes it read (`jobqueue_limits set`): they apply within
# about twice this.
OVERRIDES_EVERY = 1.0
_in_force: dict[tuple[int, str], tuple[float, dict[str, Spec]]] = {}


def changes(using: str) -> dict[str, Spec]:
    """The limits changed while workers run, as {name: Spec} (a row written badly by hand is
    left out: the settings' value holds)."""
    found = {}
    for name, concurrency, rate in LimitSetting.objects.using(using).values_list(
        "name", "concurrency", "rate"
    ):
        value = {"concurrency": concurrency, "rate": rate or None}
        try:
            found[name] = parse_spec(name, {k: v for k, v in value.items() if v})
        except ImproperlyConfigured:
            continue
    return found


def in_force(settings: JobQueueSettings, using: str) -> dict[str, Spec]:
    """Every limit of `settings` with the live changes applied, read at most every
    OVERRIDES_EVERY seconds (for a running job's `ctx.acquire()`, say)."""
    key, now = (id(settings), using), time.monotonic()
    found = _in_force.get(key)
    if found is not None and found[0] > now:
        return found[1]
    specs = {**every_limit(settings), **changes(using)}
    _in_force[key] = (now + OVERRIDES_EVERY, specs)
    return specs


def check_name(name: Any) -> str:
    """Return `name` if it may name a limit (an entry, a pattern, or a resource); else raise
    InvalidJobError, before anything is read or written."""
    return validation.check_label("limit name", name, 255, star="end")


def set_limit(
    dialect: Dialect,
    name: str,
    *,
    concurrency: int | None,
    rate: str | None,
    settings: JobQueueSettings,
    in_force: dict[str, Spec] | None = None,
) -> None:
    """Change limit `name` (an entry of the settings, or a resource an entry governs) while
    workers run; they apply it within about two seconds. What is not given keeps its value in
    force (`in_force`: the last change's, else the settings'). InvalidJobError for a bad name
    or value. `settings`: the settings whose limits `name` must be one of."""
    check_name(name)
    _known(name, settings)
    found = find(name, in_force or {})
    if found is not None:
        value_in_force = found[1].describe()
        concurrency = value_in_force["concurrency"] if concurrency is None else concurrency
        rate = value_in_force["rate"] if rate is None else rate
    value = {k: v for k, v in {"concurrency": concurrency, "rate": rate}.items() if v is not None}
    # Said in the command's words (the settings' check names JOBQUEUE['LIMITS']).
    if concurrency is not None and not valid_concurrency(concurrency):
        raise InvalidJobError(
            f"The concurrency of {name!r} must be a whole number from 1 to {INT_MAX}, "
            f"not {concurrency!r}."
        )
    if rate is not None:
        try:
            parse_rate(name, rate, setting="LIMITS")
        except ImproperlyConfigured:
            raise InvalidJobError(
                f"The rate of {name!r} must be 'N/s', 'N/m', 'N/h' or 'N/d' with a whole N from 1 "
                f"to {INT_MAX}, not {rate!r}."
            ) from None
    try:
        parse_spec(name, value)
    except ImproperlyConfigured as exc:
        raise InvalidJobError(str(exc)) from None
    LimitSetting.objects.using(dialect.using).update_or_create(
        name=name, defaults={"concurrency": concurrency, "rate": rate or ""}
    )


def reset_limit(dialect: Dialect, name: str, settings: JobQueueSettings) -> bool:
    """Go back to the settings' value of limit `name`; False if it was not changed.
    InvalidJobError if `name` is neither changed nor governed by a limit of the settings."""
    check_name(name)
    deleted, _ = LimitSetting.objects.using(dialect.using).filter(name=name).delete()
    if not deleted:  # a change of a name the settings dropped since can still be undone
        _known(name, settings)
    return bool(deleted)


def reopen(dialect: Dialect, name: str) -> bool:
    """Open resource `name` again at once (after a `RateLimited`); False if it was not closed."""
    check_name(name)
    closed = Limit.objects.using(dialect.using).filter(name=name, closed_until__isnull=False)
    return bool(closed.update(closed_until=None))


def _known(name: str, settings: JobQueueSettings) -> None:
    """Raise InvalidJobError unless a limit of `settings` governs `name`."""
    specs = every_limit(settings)
    if find(name, specs) is None:
        known = ", ".join(sorted(specs)) or "none"
        raise InvalidJobError(f"{name!r} is not a limit of the settings (known: {known}).")
