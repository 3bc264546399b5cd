"""A job's log lines: what a handler logs through `ctx.logger`, kept with its attempt.

`ctx.logger` is a LoggerAdapter of the "django_jobqueue.job" logger: each record goes to the
application's logging as any other (with the job's id, handler key and attempt as `extra`),
and those at JOBQUEUE["JOB_LOG_LEVEL"] and above are also kept in memory, whatever the logging
configuration lets through. The kept lines are written as JobLogLine rows: by the worker's
writer just before it records the run's outcome (`write_ended`: the lines of the outcomes it
writes together in one statement), and after each step that recorded its result (`flush`, in
the handler's thread); never inside another transaction of the worker's. A crash loses only
the lines not written yet, and a failure to write them is logged and never fails the job.

Each attempt keeps at most JOB_LOG_MAX_LINES lines of at most JOB_LOG_MAX_LINE_LENGTH
characters; the lines past the cap are counted, and one line saying how many were dropped is
written when the run ends.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import logging
import sys
import threading
import time
import traceback
from collections.abc import Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction

from ..conf import JobQueueSettings, level_number
from ..exceptions import JobTimeout
from ..models import JobLogLine

if TYPE_CHECKING:
    from ..dialects import Dialect

# The logger every job's ctx.logger logs through (with the job in `extra`).
LOGGER_NAME = "django_jobqueue.job"

logger = logging.getLogger("django_jobqueue.joblogs")

# A kept line: (time.time() when logged, level, message).
type Line = tuple[float, int, str]


@dataclasses.dataclass(frozen=True)
class Limits:
    """What an attempt keeps: the lowest level, how many lines, how long each may be."""

    level: int = logging.INFO
    max_lines: int = 1000
    max_line_length: int = 2000

    @classmethod
    def of(cls, conf: JobQueueSettings) -> Limits:
        """The limits the settings give (checked by conf)."""
        return _limits(conf.job_log_level, conf.job_log_max_lines, conf.job_log_max_line_length)


@functools.lru_cache(maxsize=8)
def _limits(level: int | str, max_lines: int, max_line_length: int) -> Limits:
    return Limits(level_number(level), max_lines, max_line_length)


class Lines:
    """The lines one run of an attempt keeps, until they are written (`flush`).

    Thread-safe: a handler may log from threads of its own, and an async handler's lines are
    written on its sync-call thread while the event loop goes on.
    """

    def __init__(
        self, using: str, job_id: int, attempt: int, limits: Limits, resumed: bool
    ) -> None:
        self.using, self.job_id, self.attempt, self.limits = using, job_id, attempt, limits
        self.pending: list[Line] = []
        self.kept = 0  # lines this run kept (pending or written)
        self.written = 0  # of which written
        self.dropped = 0  # lines past the cap
        # Lines an earlier run of this attempt wrote (a run resumed after a sleep or a wait
        # has the same attempt): read at the first write of a job that has records, else 0.
        self.earlier: int | None = None if resumed else 0
        self.closed = False  # the run ended: later lines (from its leftover threads) are dropped
        self.settled = False  # the run's last lines were taken to be written (at most once)
        self.lock = threading.Lock()

    def add(self, level: int, msg: Any, args: Any, exc_info: Any) -> None:
        """Keep a line (or count it as dropped past the cap); never raises, but the handler's
        JobTimeout, which may arrive while it runs."""
        if self.closed or self.kept >= self.limits.max_lines:  # nothing to format
            with self.lock:
                self.dropped += not self.closed
            return
        try:
            text = _message(msg, args, exc_info, self.limits.max_line_length)
        except JobTimeout:  # the handler's time-out, raised in its thread: never swallowed
            raise
        except Exception:  # a line that cannot be made is not worth failing a job for
            text = "(the line could not be formatted)"
        with self.lock:
            if self.closed:
                return
            if self.kept >= self.limits.max_lines:  # another thread's line took the last room
                self.dropped += 1
                return
            self.kept += 1
            self.pending.append((time.time(), level, text))

    def end(self) -> bool:
        """Take no more lines (the run ended); return whether `flush(final=True)` has
        anything to write."""
        with self.lock:
            self.closed = True
            return bool(self.pending or self.dropped)

    def flush(self, *, final: bool = False) -> None:
        """Write the pending lines in one statement (and, at the run's end, the line that
        says how many were dropped); log a failure, never raise it.

        Not inside a transaction of the handler's (a step called in `atomic()`): the lines
        would share its fate; they wait for the next write instead (at the latest the
        run's end, when the worker writes them: `write_ended`).
        """
        if not final and connections[self.using].in_atomic_block:
            return
        lines = self.take(final=final)
        if not lines and not (final and self.dropped):
            return
        try:
            rows = self.rows(lines, final=final)
            if rows:
                # A savepoint if the handler left a transaction open: a failure here does
                # not break it.
                with transaction.atomic(using=self.using):
                    JobLogLine.objects.using(self.using).bulk_create(rows)
        except JobTimeout:  # the handler's time-out, raised in its thread: never swallowed
            raise
        except Exception:
            logger.warning(
                "Could not store %s log line(s) of job id=%s attempt=%s",
                len(lines), self.job_id, self.attempt, exc_info=True,
            )  # fmt: skip

    def take(self, *, final: bool) -> list[Line]:
        """Take the pending lines to write them; `final`: the run ended, keep no more."""
        with self.lock:
            lines, self.pending = self.pending, []
            if final:
                self.closed = True
        return lines

    def rows(self, lines: list[Line], *, final: bool) -> list[JobLogLine]:
        """The rows of `lines` within the attempt's cap, and at the run's end (`final`) the
        line that says how many were dropped. Reads how many lines the attempt's earlier
        runs wrote, the first time it needs to."""
        if self.earlier is None:
            stored = JobLogLine.objects.using(self.using)
            self.earlier = stored.filter(job_id=self.job_id, attempt=self.attempt).count()
        room = max(0, self.limits.max_lines - self.earlier - self.written)
        if len(lines) > room:  # the earlier runs of the attempt used some of the cap
            with self.lock:
                self.dropped += len(lines) - room
            lines = lines[:room]
        rows = [self._row(logged, level, text) for logged, level, text in lines]
        if final:
            self.settled = True
        if final and self.dropped:
            lines_dropped = "1 line" if self.dropped == 1 else f"{self.dropped} lines"
            note = (
                f"{lines_dropped} dropped: an attempt keeps {self.limits.max_lines} "
                "(JOBQUEUE['JOB_LOG_MAX_LINES'])"
            )
            rows.append(self._row(time.time(), logging.WARNING, note))
        self.written += len(lines)
        return rows

    def _row(self, logged: float, level: int, text: str) -> JobLogLine:
        return JobLogLine(
            job_id=self.job_id,
            attempt=self.attempt,
            level=level,
            logged_at=dt.datetime.fromtimestamp(logged, dt.UTC),
            message=text,
        )


def write_ended(dialect: Dialect, ended: Sequence[Lines]) -> None:
    """Write what the runs that ended (`ended`) kept and have not written yet, together: one
    statement, in a short transaction of its own (a savepoint of the caller's open one); log
    a failure, never raise it.

    The worker's writer calls it (through `outcomes.record`) just before it writes the
    outcomes of those runs: the lines of the outcomes it writes together share one INSERT
    and one commit, and are there by the time the job is final.
    """
    rows: list[JobLogLine] = []
    try:
        for lines in ended:
            if lines.settled:  # an outcome written again (its row was busy): done already
                continue
            taken = lines.take(final=True)
            if taken or lines.dropped:
                rows.extend(lines.rows(taken, final=True))
        if rows:
            objects = JobLogLine.objects.using(dialect.using)
            dialect.run_in_caller_transaction(lambda: objects.bulk_create(rows))
    except Exception:
        logger.warning(
            "Could not store the log lines of job(s) %s",
            ", ".join(sorted({f"id={lines.job_id}" for lines in ended})), exc_info=True,
        )  # fmt: skip


def _message(msg: Any, args: Any, exc_info: Any, limit: int) -> str:
    """The line as logging formats a record's message, with its traceback, cut to `limit`."""
    # As LogRecord does: one mapping argument is the mapping of "%(name)s" fields.
    if len(args) == 1 and isinstance(args[0], Mapping) and args[0]:
        args = args[0]
    try:
        text = str(msg) % args if args else str(msg)
    except Exception:
        text = f"{msg!r} (arguments that do not fit it: {args!r})"
    if exc_info:
        if isinstance(exc_info, BaseException):
            exc_info = (type(exc_info), exc_info, exc_info.__traceback__)
        elif not isinstance(exc_info, tuple):
            exc_info = sys.exc_info()
        if exc_info[0] is not None:
            text = f"{text}\n{''.join(traceback.format_exception(*exc_info)).rstrip()}"
    text = _storable(text)  # escaped first: the cut is of what is stored
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


def _storable(text: str) -> str:
    """`text` as every database stores it: no NUL (PostgreSQL refuses it in text), and no
    lone surrogate (no database encodes it)."""
    if text.isascii():
        return text.replace("\x00", "\\x00") if "\x00" in text else text
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text.replace("\x00", "\\x00")


class JobLogger(logging.LoggerAdapter[logging.Logger]):
    """`ctx.logger`: logs through the "django_jobqueue.job" logger, with the job's id, handler
    key and attempt as `extra` (job_id, job_type, attempt), and keeps the lines at
    JOBQUEUE["JOB_LOG_LEVEL"] and above with the job's attempt (JobLogLine).

    A line is kept whatever the logging configuration lets through: the two are independent.
    """

    def __init__(self, lines: Lines, job_type: str) -> None:
        extra = {"job_id": lines.job_id, "job_type": job_type, "attempt": lines.attempt}
        super().__init__(logging.getLogger(LOGGER_NAME), extra)
        self.lines = lines

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        """Add the job's fields to the record's `extra` (the caller's own extra wins)."""
        assert self.extra is not None
        kwargs["extra"] = {**self.extra, **(kwargs.get("extra") or {})}
        return msg, kwargs

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
        """Keep the line if its level is kept, and log it as the logger's configuration says."""
        limits = self.lines.limits
        if isinstance(level, int) and level >= limits.level and limits.max_lines:
            self.lines.add(level, msg, args, kwargs.get("exc_info"))
        if self.logger.isEnabledFor(level):
            msg, kwargs = self.process(msg, kwargs)
            # The record names the handler's line, not this method's.
            kwargs["stacklevel"] = kwargs.get("stacklevel", 1) + 1
            self.logger.log(level, msg, *args, **kwargs)
