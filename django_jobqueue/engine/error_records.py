"""Error records: what a failed attempt leaves in Job.last_error and Job.errors."""

from __future__ import annotations

import traceback
from typing import Any

from ..exceptions import ReplayMismatch
from ..validation import printable

# An error record stays far below what any database accepts in a row, however often a job
# fails: message and traceback are cut (the traceback keeps its end, where the error is) and
# the per-attempt history keeps the most recent entries.
MAX_ERROR_MESSAGE = 2_000
MAX_ERROR_TRACEBACK = 20_000
MAX_ERROR_HISTORY = 25
# What one log line carries of a handler's exception message (the stored record has the rest).
MAX_LOG_MESSAGE = 2_000


def error_info(exc: BaseException, attempt: int, *, with_traceback: bool = True) -> dict[str, Any]:
    """Describe `exc` for Job.last_error: class path, message, traceback, attempt."""
    cls = type(exc)
    try:
        message = str(exc)
    except Exception:  # a broken __str__ must not lose the attempt's outcome
        message = f"<{cls.__qualname__} whose str() failed>"
    tb = "".join(traceback.format_exception(exc)) if with_traceback else ""
    record = error_record(cls, message, attempt, traceback=tb)
    if isinstance(exc, ReplayMismatch):  # where the replay stopped agreeing (the admin's retry)
        record["place"] = exc.place
    return record


def error_record(
    kind: str | type[BaseException], message: str, attempt: int | None, *, traceback: str = ""
) -> dict[str, Any]:
    """Build an error record of exception class `kind` (or its dotted path), cleaned and cut."""
    name = kind if isinstance(kind, str) else f"{kind.__module__}.{kind.__qualname__}"
    return {
        "type": storable_text(name),
        "message": _cut(storable_text(message), MAX_ERROR_MESSAGE),
        "traceback": _cut(storable_text(traceback), MAX_ERROR_TRACEBACK, keep_end=True),
        "attempt": attempt,
    }


def log_text(value: object, limit: int = MAX_LOG_MESSAGE) -> str:
    """Return `str(value)` for a log line: never raising, on one line, at most `limit` long.

    A handler's exception message is the handler's text: it may be megabytes long, hold
    newlines that forge log lines, or control characters that drive a terminal. Those are
    escaped (validation.printable) and the text is cut, so a log line stays one bounded line.
    """
    try:
        text = str(value)
    except Exception:  # a broken __str__ must not lose the log line
        text = f"<{type(value).__qualname__} whose str() failed>"
    cut = len(text) - limit
    if cut > 0:
        text = text[:limit]
    text = storable_text(printable(text))[:limit]  # escaping lengthens it: cut again
    return text + f"[... {cut:,} characters cut ...]" if cut > 0 else text


def with_error(history: list[dict[str, Any]] | None, error: dict[str, Any]) -> list[dict[str, Any]]:
    """Return the per-attempt error history with `error` added, at most MAX_ERROR_HISTORY long."""
    return [*(history or []), error][-MAX_ERROR_HISTORY:]


def storable_text(text: str) -> str:
    """Return `text` without NUL characters and with lone surrogates escaped (\\udxxx)."""
    text = text.replace("\x00", "")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _cut(text: str, limit: int, *, keep_end: bool = False) -> str:
    if len(text) <= limit:
        return text
    mark = f"[... {len(text) - limit:,} characters cut ...]"
    return mark + text[-limit:] if keep_end else text[:limit] + mark
