"""Checks on enqueue input: each raises a documented InvalidJobError before anything is written."""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Mapping
from typing import Any, cast

from django.utils import timezone

from .exceptions import (
    RETRY_AT_MAX,
    RETRY_AT_MIN,
    RETRY_DELAY_MAX,
    InvalidArgumentsError,
    InvalidJobError,
    in_datetime_range,
)

# The grammar of names, re-exported: it is checked here as it always was.
from .names import UNSAFE_CHARS as UNSAFE_CHARS
from .names import Star as Star
from .names import name_problem as name_problem
from .names import printable as printable
from .names import text_problem

# The integer columns (weight, priority, max_attempts) are 32-bit on PostgreSQL and MySQL.
INT_MIN, INT_MAX = -(2**31), 2**31 - 1
ID_MAX = 2**63 - 1  # job ids are 64-bit
# Objects and arrays nested in one JSON value, the outermost counted: MariaDB's JSON_VALID
# (its JSON columns' CHECK constraint) refuses 32 or more, so args and results stop below that.
MAX_JSON_DEPTH = 30
FLOAT_EXACT = 1e16  # floats from here on are written with an exponent (see _first_unserializable)
# run_after must lie in this range (UTC): every database stores it, and a date near the ends
# of Python's range cannot overflow when converted between time zones.
RUN_AFTER_MIN, RUN_AFTER_MAX = RETRY_AT_MIN, RETRY_AT_MAX
# A relative run_after (a timedelta) may reach this far from now, either way.
DELAY_MAX = RETRY_DELAY_MAX


def check_args(key: str, args: Any, max_bytes: int | None = None) -> dict[str, Any]:
    """Return `args` as a dict after checking it is a JSON object of JSON values that fits."""
    if args is None or (type(args) is dict and not args):
        return {}
    if not isinstance(args, Mapping):
        raise InvalidArgumentsError(
            f"Arguments for {key!r} must be a JSON object (a dict), not {type(args).__name__}."
        )
    for name in args:
        if not isinstance(name, str):
            raise InvalidArgumentsError(
                f"Arguments for {key!r}: key {name!r} is not a string; handlers are called "
                "with **args."
            )
    value = dict(args)
    problem = json_problem(value, "args", max_bytes)
    if problem:
        raise InvalidArgumentsError(f"Arguments for {key!r} cannot be stored: {problem}.")
    return value


def json_problem(value: Any, path: str, max_bytes: int | None = None) -> str | None:
    """Why `value` cannot be stored in a JSON column (and read back equal), or None.

    Checks what every database refuses (NUL, lone surrogates, NaN, more than MAX_JSON_DEPTH
    levels of nesting), what json.dumps refuses (other types, integers over Python's
    4,300-digit conversion limit, cycles) and, with `max_bytes`, the size of the JSON text.
    """
    try:
        problem = _first_unserializable(value, path)
        if problem:
            return problem
        text = json.dumps(value, allow_nan=False)
    except RecursionError:
        return f"{path} is nested too deeply (or refers to itself)"
    except (TypeError, ValueError) as exc:
        return f"{path} is not JSON-serializable ({exc})"
    if max_bytes is not None and len(text) > max_bytes:  # ASCII: one byte a character
        return f"{path} is {len(text):,} bytes as JSON, over the limit of {max_bytes:,}"
    return None


def _first_unserializable(value: Any, path: str, depth: int = 1) -> str | None:
    if isinstance(value, list | tuple | dict) and depth > MAX_JSON_DEPTH:
        return (
            f"{path} is nested too deeply (more than {MAX_JSON_DEPTH} levels of objects and "
            "arrays, or it refers to itself)"
        )
    if isinstance(value, str):
        problem = text_problem(value)
        return f"{path} {problem}" if problem else None
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        # json.dumps would raise ValueError past sys.get_int_max_str_digits() (4,300 digits).
        return f"{path} is an integer too long to store" if value.bit_length() > 14_000 else None
    if isinstance(value, float):
        if not math.isfinite(value):
            return f"{path} is {value!r} (not valid JSON)"
        if abs(value) >= FLOAT_EXACT:
            # PostgreSQL's jsonb keeps numbers as decimals and prints them without an exponent:
            # 3.602879701896397e+16 would come back as the int 36028797018963970.
            return (
                f"{path} is {value!r}: floats of 1e16 or more do not come back equal from "
                "every database; pass an int or a string"
            )
        return None
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            found = _first_unserializable(item, f"{path}[{i}]", depth + 1)
            if found:
                return found
        return None
    if isinstance(value, dict):
        for k, item in value.items():
            if not isinstance(k, str):
                return f"{path} has a non-string key {k!r}"
            problem = text_problem(k)
            if problem:
                return f"{path} has a key {k!r} that {problem}"
            found = _first_unserializable(item, f"{path}[{k!r}]", depth + 1)
            if found:
                return found
        return None
    try:  # anything else (a subclass of a JSON type, say) must survive json.dumps as it is
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return f"{path} is a {type(value).__name__}, which is not JSON-serializable"
    return None


def check_positive_int(name: str, value: Any) -> int:
    """Return `value` if it is an integer >= 1 that fits its column."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= INT_MAX:
        raise InvalidJobError(f"{name} must be an integer from 1 to {INT_MAX}, not {value!r}.")
    return value


def check_int(name: str, value: Any) -> int:
    """Return `value` if it is an integer that fits its column."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidJobError(f"{name} must be an integer, not {value!r}.")
    if not INT_MIN <= value <= INT_MAX:
        raise InvalidJobError(f"{name} must be from {INT_MIN} to {INT_MAX}, not {value!r}.")
    return value


def check_timeout(value: Any) -> float | None:
    """Return the timeout in seconds (from seconds or a timedelta), or None."""
    if value is None:
        return None
    if isinstance(value, dt.timedelta):
        value = value.total_seconds()
    if not finite(value):
        raise InvalidJobError(f"timeout must be seconds or a timedelta, not {value!r}.")
    if value <= 0:
        raise InvalidJobError(f"timeout must be positive, not {value!r}.")
    return float(value)


# Where a name may hold a "*" (`name_problem`): "text", as any other character (a queue, a
# key); "none", never (a resource: a job uses one, RateLimited closes one); "end", only as its
# last character, which makes it a pattern (a JOBQUEUE["LIMITS"] entry, a limit to change).
def check_label(
    name: str,
    value: Any,
    max_length: int,
    *,
    allow_empty: bool = False,
    allow_control: bool = False,
    star: Star = "text",
) -> str:
    """Return `value` if it is a name that fits its column (see `name_problem`); else raise
    InvalidJobError naming it as `name`."""
    problem = name_problem(
        value, max_length, allow_empty=allow_empty, allow_control=allow_control, star=star
    )
    if problem:
        raise InvalidJobError(f"{name} {problem}.")
    return cast(str, value)  # a str, or name_problem had said so


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    """Return `value` if it is one of `choices`; else raise InvalidJobError naming it."""
    if not isinstance(value, str) or value not in choices:
        listed = " or ".join(repr(c) for c in choices)
        raise InvalidJobError(f"{name} must be {listed}, not {value!r}.")
    return value


def check_run_after(value: Any) -> dt.datetime | dt.timedelta | None:
    """Return `value` if it is None, a timedelta within DELAY_MAX, or an aware datetime in range."""
    if value is None:
        return None
    if isinstance(value, dt.timedelta):
        if abs(value) > DELAY_MAX:
            raise InvalidJobError(
                f"run_after as a timedelta must be within {DELAY_MAX.days} days of now, "
                f"not {value!r}."
            )
        return value
    if not isinstance(value, dt.datetime):
        raise InvalidJobError(f"run_after must be a datetime or a timedelta, not {value!r}.")
    return check_datetime("run_after", value)


def check_datetime(name: str, value: Any) -> dt.datetime:
    """Return `value`, in UTC, if it is an aware datetime from RUN_AFTER_MIN to before
    RUN_AFTER_MAX."""
    if not isinstance(value, dt.datetime):
        raise InvalidJobError(f"{name} must be a datetime, not {value!r}.")
    if timezone.is_naive(value):
        raise InvalidJobError(f"{name} must be a timezone-aware datetime.")
    if not in_datetime_range(value, RUN_AFTER_MIN, RUN_AFTER_MAX):
        raise InvalidJobError(
            f"{name} must be from {RUN_AFTER_MIN:%Y-%m-%d} to before "
            f"{RUN_AFTER_MAX:%Y-%m-%d} (UTC), not {value.isoformat()}."
        )
    # The same instant in UTC: PostgreSQL refuses the offsets Python allows past +-15:59 and
    # those with seconds or microseconds ("time zone displacement out of range").
    return value.astimezone(dt.UTC)


def check_seconds(name: str, value: Any) -> float:
    """Return `value` (seconds, or a timedelta) in seconds if it is from 0 to DELAY_MAX."""
    if isinstance(value, dt.timedelta):
        value = value.total_seconds()
    number = check_number(name, value)
    if not 0 <= number <= DELAY_MAX.total_seconds():
        raise InvalidJobError(f"{name} must be from 0 to {DELAY_MAX.days} days, not {value!r}.")
    return float(number)


def finite(value: Any) -> bool:
    """Whether `value` is an int or a float (not a bool) that is finite as a float: an int
    too large for one (10**400) is not, where math.isfinite() would raise OverflowError."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def check_number(name: str, value: Any) -> float:
    """Return `value` if it is a finite int or float (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidJobError(f"{name} must be a number, not {value!r}.")
    if not finite(value):
        raise InvalidJobError(f"{name} must be a finite number, not {value!r}.")
    return value
