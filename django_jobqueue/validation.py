"""Checks on enqueue input: each raises a documented InvalidJobError before anything is written."""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.utils import timezone

from .exceptions import InvalidArgumentsError, InvalidJobError

# The integer columns (weight, priority, max_attempts) are 32-bit on PostgreSQL and MySQL.
INT_MIN, INT_MAX = -(2**31), 2**31 - 1


def check_args(key: str, args: Any) -> dict[str, Any]:
    """Return `args` as a dict after checking it is a JSON object of JSON values."""
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
    problem = _first_unserializable(dict(args), "args")
    if problem:
        raise InvalidArgumentsError(f"Arguments for {key!r} are not JSON-serializable: {problem}.")
    return dict(args)


def _text_problem(text: str) -> str | None:
    """Why a database cannot store `text` (PostgreSQL rejects both), or None."""
    if "\x00" in text:
        return "contains a NUL character, which databases cannot store"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate, which is not valid Unicode"
    return None


def _first_unserializable(value: Any, path: str) -> str | None:
    if isinstance(value, str):
        problem = _text_problem(value)
        return f"{path} {problem}" if problem else None
    if value is None or isinstance(value, bool | int):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path} is {value!r} (not valid JSON)"
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            found = _first_unserializable(item, f"{path}[{i}]")
            if found:
                return found
        return None
    if isinstance(value, dict):
        for k, item in value.items():
            if not isinstance(k, str):
                return f"{path} has a non-string key {k!r}"
            problem = _text_problem(k)
            if problem:
                return f"{path} has a key {k!r} that {problem}"
            found = _first_unserializable(item, f"{path}[{k!r}]")
            if found:
                return found
        return None
    try:  # anything else (a subclass of a JSON type, say) must survive json.dumps as it is
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return f"{path} is a {type(value).__name__}"
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
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidJobError(f"timeout must be seconds or a timedelta, not {value!r}.")
    if value <= 0:
        raise InvalidJobError(f"timeout must be positive, not {value!r}.")
    return float(value)


def check_label(name: str, value: Any, max_length: int, *, allow_empty: bool = False) -> str:
    """Return `value` if it is a string that fits its column."""
    if not isinstance(value, str) or (not value and not allow_empty):
        raise InvalidJobError(f"{name} must be a non-empty string, not {value!r}.")
    if len(value) > max_length:
        raise InvalidJobError(f"{name} must be at most {max_length} characters.")
    problem = _text_problem(value)
    if problem:
        raise InvalidJobError(f"{name} {problem}.")
    return value


def check_run_after(value: Any) -> dt.datetime | dt.timedelta | None:
    """Return `value` if it is None, a timedelta, or a datetime that fits USE_TZ."""
    if value is None or isinstance(value, dt.timedelta):
        return value
    if not isinstance(value, dt.datetime):
        raise InvalidJobError(f"run_after must be a datetime or a timedelta, not {value!r}.")
    if settings.USE_TZ and timezone.is_naive(value):
        raise InvalidJobError("run_after must be timezone-aware when USE_TZ is True.")
    return value
