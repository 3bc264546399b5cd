"""One place that reads ``settings.JOBQUEUE``, with typed defaults, and checks it.

Each section of the settings (the durations, the counts and switches, the databases, the group
limits, LIMITS, the shape of SCHEDULES, RETENTION) checks its own keys and yields one Problem
per bad value: system check E001 reports them all at once, and `load()` raises them together.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import difflib
import logging
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from .exceptions import InvalidJobError

# LIMITS is checked by the grammar of the limits engine (which reads no settings itself).
from .limits.spec import derived, find, limits_problems, parse_limits, parse_rate, parse_spec
from .validation import check_label, finite, name_problem


@dataclasses.dataclass(frozen=True)
class JobQueueSettings:
    """The effective settings; every field is a key of ``settings.JOBQUEUE`` in upper case."""

    database: str = "default"  # alias of the database that holds the queue tables
    # alias the listener's LISTEN uses (straight to the server, past a transaction pooler);
    # None: DATABASE
    listen_database: str | None = None
    default_queue: str = "default"
    max_attempts: int = 3  # attempts per job unless enqueue() says otherwise
    timeout: float | None = None  # seconds a dispatch may run; None: no limit
    lease_ttl: float = 30.0  # seconds a claim stays valid without a heartbeat
    heartbeat_interval: float = 10.0  # seconds between lease renewals
    poll_interval: float = 1.0  # seconds between polls when idle
    shutdown_timeout: float = 30.0  # seconds in-flight jobs get after SIGTERM
    retry_backoff: float = 2.0  # base of the exponential backoff, seconds
    retry_backoff_max: float = 3600.0  # ceiling of one backoff delay, seconds
    reclaim_interval: float = 1.0  # seconds between stale-lease sweeps of one worker
    reclaim_batch: int = 100  # rows one sweep moves at most
    max_abandoned_threads: int = 3  # timed-out threads a worker tolerates before restarting
    # threads (each with its connections) that run the ORM calls of a worker's async jobs, one
    # job to a thread at a time; at most --concurrency (worker/sync_calls.py)
    sync_call_threads: int = 4
    # when a handler gives a connection of Django's pool back: "job" (when the job ends) or
    # "query" (also whenever its last cursor closes outside a transaction); connection_pool.py
    pool_return: str = "job"
    # what a sequence's job ending `dead` does to the jobs after it (sequences.py): "continue"
    # (the next one starts) or "block" (none starts until it is retried or cancelled)
    sequence_on_failure: str = "continue"
    group_limits: dict[str, int] = dataclasses.field(default_factory=dict)  # group -> max running
    queue_limits: dict[str, int] = dataclasses.field(default_factory=dict)  # queue -> max running
    dynamic_limit: Any = None  # callable(group) -> int | None, or its dotted path
    fair_share_refresh: float = 1.0  # seconds a worker reuses its view of the ready groups
    lock_timeout: float = 5.0  # seconds any worker statement waits for a lock, at most
    prefetch: int = 128  # jobs claimed beyond free threads, while recent jobs are short
    max_args_bytes: int = 1_048_576  # largest args of one job, as JSON text
    max_result_bytes: int = 1_048_576  # largest result of one job, as JSON text
    schedules: dict[str, Any] = dataclasses.field(default_factory=dict)  # name -> definition
    rate_limits: dict[str, str] = dataclasses.field(default_factory=dict)  # group -> "N/period"
    # resource or pattern ("tenant:*") -> {"concurrency": N, "rate": "N/period"}; see limits.py
    limits: dict[str, Any] = dataclasses.field(default_factory=dict)
    schedule_clock: Any = None  # callable() -> aware datetime, or its dotted path (tests)
    # seconds an open (unsealed) container may go without a write or a new child before the
    # workers fail it as ContainerNotSealed; None: never
    open_container_timeout: float | None = 3600.0
    # whether workers do the upkeep of the queue's tables the database is not doing (on
    # PostgreSQL: VACUUM and ANALYZE where autovacuum is off or lags; see worker/maintainer.py)
    maintenance: bool = True
    # final state -> age ("7d", seconds, a timedelta) after which workers delete such jobs;
    # a state left out, or None, is kept forever
    retention: dict[str, Any] = dataclasses.field(default_factory=dict)
    # traces and metrics through the application's OpenTelemetry providers (telemetry/): True,
    # or a dict of TELEMETRY_OPTIONS; False (the default) imports nothing of OpenTelemetry
    opentelemetry: bool | dict[str, Any] = False
    # what ctx.logger keeps with each attempt (joblogs.py): the lowest level (a number or a
    # name, "INFO"), the lines an attempt keeps (0: none), and the characters of one line
    job_log_level: int | str = "INFO"
    job_log_max_lines: int = 1000
    job_log_max_line_length: int = 2000

    def retention_ages(self) -> dict[str, dt.timedelta]:
        """The states RETENTION prunes, with their ages."""
        return {s: parse_age(a) for s, a in self.retention.items() if a is not None}


# The values of SEQUENCE_ON_FAILURE and of enqueue()'s sequence_on_failure.
SEQUENCE_ON_FAILURE = ("continue", "block")
FINAL_STATES = ("done", "cancelled", "dead")  # Job.TERMINAL_STATES (no model import here)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_MAX_AGE = 100 * 365 * 86400


def parse_age(value: str | float | dt.timedelta) -> dt.timedelta:
    """Return an age given as "7d" (a number and s, m, h or d), seconds, or a timedelta."""
    if isinstance(value, dt.timedelta):
        seconds = value.total_seconds()
    elif finite(value):
        seconds = float(value)
    elif isinstance(value, str) and (match := _AGE.match(value)):
        seconds = float(match[1]) * _UNITS[match[2]]
    else:
        raise ValueError(f"{value!r} is not an age: give a number and a unit, s, m, h or d (7d).")
    if not 0 <= seconds <= _MAX_AGE:
        raise ValueError(f"{value!r} is not an age between 0 and 100 years.")
    return dt.timedelta(seconds=seconds)


# The integer columns and the limits they are compared with are 32-bit on PostgreSQL and MySQL.
INT_MAX = 2**31 - 1
# The longest lease TTL, interval or lock wait, in seconds (about 11.6 days). Longer values
# overflow where they are used (PostgreSQL's lock and idle timeouts are 32-bit milliseconds; a
# thread's wait stops at threading.TIMEOUT_MAX), so they are refused at start-up rather than
# failing every duty of the worker.
MAX_INTERVAL = 1_000_000.0

_FIELDS = {f.name: f for f in dataclasses.fields(JobQueueSettings)}


class Problem(NamedTuple):
    """One bad value of ``settings.JOBQUEUE``: what system check E001 reports, each on its own."""

    setting: str  # the key ("LEASE_TTL"); "" when JOBQUEUE as a whole is bad
    message: str  # names the setting (and the entry): the text ImproperlyConfigured carries
    entry: tuple[Any, ...] = ()  # (key,) when one entry of a dict-valued setting is bad
    hint: str | None = None


def load(raw: dict[str, Any] | None = None) -> JobQueueSettings:
    """Build the settings from a ``JOBQUEUE`` dict, raising ImproperlyConfigured on bad values.

    The error lists every bad value, as the system checks do (with one, its message alone).
    """
    loaded, found = _read(raw)
    if loaded is not None:
        found.extend(_problems(loaded))
    if found:
        raise ImproperlyConfigured(_one_message([p.message for p in found]))
    assert loaded is not None  # no problem: JOBQUEUE was a dict
    return loaded


def _one_message(messages: list[str]) -> str:
    """The message of one problem as it is, or a list of several."""
    if len(messages) == 1:
        return messages[0]
    listed = "".join(f"\n- {message}" for message in messages)
    return f"settings.JOBQUEUE has {len(messages)} problems:{listed}"


def examine(raw: Any = None) -> tuple[list[Problem], JobQueueSettings]:
    """Return every problem of ``JOBQUEUE``, and the settings with the bad values left out.

    In those settings a bad setting has its default and a bad entry of a dict-valued one is
    dropped: the checks of what reads the settings (each schedule's, E010) compare against
    them, so that they report their own problems while E001 reports these.
    """
    loaded, found = _read(raw)
    if loaded is None:
        return found, JobQueueSettings()
    found.extend(_problems(loaded))
    defaults, whole = JobQueueSettings(), {p.setting.lower() for p in found if not p.entry}
    changes = {name: getattr(defaults, name) for name in whole if name in _FIELDS}
    for problem in found:
        name = problem.setting.lower()
        if problem.entry and name not in whole:  # an entry of a dict: the others are kept
            kept = changes.get(name, getattr(loaded, name))
            changes[name] = {k: v for k, v in kept.items() if k is not problem.entry[0]}
    return found, dataclasses.replace(loaded, **changes)


def _read(raw: Any) -> tuple[JobQueueSettings | None, list[Problem]]:
    """The settings a JOBQUEUE dict sets (unchecked), and its unknown keys as problems."""
    if raw is None:
        raw = getattr(settings, "JOBQUEUE", {}) or {}
    if not isinstance(raw, dict):
        return None, [Problem("", "settings.JOBQUEUE must be a dict.")]
    values: dict[str, Any] = {}
    found = []
    for key, value in raw.items():
        name = key.lower() if isinstance(key, str) else ""
        if name and key.isupper() and name in _FIELDS:
            values[name] = value
            continue
        known = [n.upper() for n in _FIELDS]
        close = difflib.get_close_matches(str(key).upper(), known, n=1)
        found.append(
            Problem(
                str(key),
                f"Unknown JOBQUEUE setting {key!r}; known: {', '.join(sorted(known))}.",
                hint=f"Did you mean {close[0]!r}?" if close else None,
            )
        )
    return JobQueueSettings(**values), found


def _problems(conf: JobQueueSettings) -> Iterator[Problem]:
    """Every bad value of `conf`, section by section (each checks only its own keys)."""
    for section in SECTIONS:
        yield from section(conf)


def _times(conf: JobQueueSettings) -> Iterator[Problem]:
    """The durations: intervals, timeouts, and the heartbeat that must fit twice in the lease."""
    for name in (
        "lease_ttl",
        "heartbeat_interval",
        "poll_interval",
        "retry_backoff",
        "retry_backoff_max",
        "reclaim_interval",
        "fair_share_refresh",
        "lock_timeout",
        "timeout",
        "open_container_timeout",
    ):
        value = getattr(conf, name)
        if value is None and name in ("timeout", "open_container_timeout"):
            continue
        if not finite(value) or value <= 0:
            yield Problem(name.upper(), f"JOBQUEUE[{name.upper()!r}] must be a positive number.")
        elif name != "timeout" and value > MAX_INTERVAL:
            yield Problem(
                name.upper(),
                f"JOBQUEUE[{name.upper()!r}] must be at most {MAX_INTERVAL:,.0f} seconds "
                f"(about 11.6 days), not {value!r}.",
            )
    if not finite(conf.shutdown_timeout) or not 0 <= conf.shutdown_timeout <= MAX_INTERVAL:
        yield Problem(
            "SHUTDOWN_TIMEOUT",
            "JOBQUEUE['SHUTDOWN_TIMEOUT'] must be a number of seconds from 0 to "
            f"{MAX_INTERVAL:,.0f} (about 11.6 days).",
        )
    lease, beat = conf.lease_ttl, conf.heartbeat_interval
    # Compared only when both are good: each bad one has its own message above.
    if all(finite(v) and 0 < v <= MAX_INTERVAL for v in (lease, beat)) and beat * 2 > lease:
        yield Problem(
            "HEARTBEAT_INTERVAL",
            "JOBQUEUE['HEARTBEAT_INTERVAL'] must be at most half of JOBQUEUE['LEASE_TTL'], "
            "so one missed heartbeat does not lose a live lease.",
        )


def _core(conf: JobQueueSettings) -> Iterator[Problem]:
    """The counts, the switches and the default queue."""
    for name in (
        "max_attempts",
        "reclaim_batch",
        "max_abandoned_threads",
        "sync_call_threads",
        "max_args_bytes",
        "max_result_bytes",
    ):
        value = getattr(conf, name)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= INT_MAX:
            yield Problem(
                name.upper(), f"JOBQUEUE[{name.upper()!r}] must be an integer from 1 to {INT_MAX}."
            )
    if conf.sequence_on_failure not in SEQUENCE_ON_FAILURE:
        yield Problem(
            "SEQUENCE_ON_FAILURE",
            "JOBQUEUE['SEQUENCE_ON_FAILURE'] must be 'continue' or 'block'.",
        )
    if conf.pool_return not in ("job", "query"):
        yield Problem("POOL_RETURN", "JOBQUEUE['POOL_RETURN'] must be 'job' or 'query'.")
    if not isinstance(conf.maintenance, bool):
        yield Problem("MAINTENANCE", "JOBQUEUE['MAINTENANCE'] must be True or False.")
    if isinstance(conf.prefetch, bool) or not isinstance(conf.prefetch, int) or conf.prefetch < 0:
        yield Problem("PREFETCH", "JOBQUEUE['PREFETCH'] must be an integer >= 0.")
    if conf.schedule_clock is not None and not (
        callable(conf.schedule_clock) or isinstance(conf.schedule_clock, str)
    ):
        yield Problem(
            "SCHEDULE_CLOCK",
            "JOBQUEUE['SCHEDULE_CLOCK'] must be a callable or the dotted path of one.",
        )
    try:  # the checks enqueue() makes of a queue name: every enqueue would fail otherwise
        check_label("queue", conf.default_queue, 100)
    except InvalidJobError as exc:
        yield Problem(
            "DEFAULT_QUEUE",
            "JOBQUEUE['DEFAULT_QUEUE'] must be a non-empty string of at most 100 characters, "
            f"without NUL or control characters: {exc}",
        )


def _databases(conf: JobQueueSettings) -> Iterator[Problem]:
    """DATABASE and LISTEN_DATABASE: aliases of settings.DATABASES, of one database."""
    database_ok = False
    if not isinstance(conf.database, str):
        yield Problem(
            "DATABASE",
            f"JOBQUEUE['DATABASE'] must be a database alias (a string), not {conf.database!r}.",
        )
    elif conf.database not in settings.DATABASES:
        yield Problem(
            "DATABASE",
            f"JOBQUEUE['DATABASE'] is {conf.database!r}, which is not in settings.DATABASES.",
        )
    else:
        database_ok = True
    listen = conf.listen_database
    if listen is None:
        return
    if not isinstance(listen, str) or listen not in settings.DATABASES:
        yield Problem(
            "LISTEN_DATABASE",
            f"JOBQUEUE['LISTEN_DATABASE'] is {listen!r}, which is not an alias in "
            "settings.DATABASES (it names the connection, straight to the queue's PostgreSQL "
            "database, that the workers LISTEN on; leave it out to use JOBQUEUE['DATABASE']).",
        )
    elif database_ok:
        from django.db import connections

        vendor, queue = connections[listen].vendor, connections[conf.database].vendor
        if vendor != queue:
            yield Problem(
                "LISTEN_DATABASE",
                f"JOBQUEUE['LISTEN_DATABASE'] is {listen!r}, a {vendor} database, but the "
                f"queue database {conf.database!r} is {queue}: it must be another alias of the "
                "same database.",
            )


def _group_limits(conf: JobQueueSettings) -> Iterator[Problem]:
    """GROUP_LIMITS, QUEUE_LIMITS, RATE_LIMITS and DYNAMIC_LIMIT: one message per bad entry."""
    for name in ("GROUP_LIMITS", "QUEUE_LIMITS"):
        limits = getattr(conf, name.lower())
        rule = (
            f"JOBQUEUE[{name!r}] must map names of 1 to 200 characters (no control characters) "
            f"to integers from 1 to {INT_MAX}"
        )
        if not isinstance(limits, dict):
            yield Problem(name, f"{rule}.")
            continue
        for key, value in limits.items():
            # The names are stored in a 255-character column (ConcurrencyLimit.key, "group:<name>").
            problem = name_problem(key, 200)
            if problem:
                yield Problem(name, f"{rule}: a name {problem}.", (key,))
            elif isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= INT_MAX:
                yield Problem(name, f"{rule}: {key!r} maps to {value!r}.", (key,))
    if not isinstance(conf.rate_limits, dict):
        yield Problem("RATE_LIMITS", "JOBQUEUE['RATE_LIMITS'] must map group names to 'N/period'.")
    else:
        for group, rate in conf.rate_limits.items():
            # A group's rate has a lock row named "group:<name>" in a 255-character column, as
            # a GROUP_LIMITS entry has: the same 200 characters at most.
            problem = name_problem(group, 200)
            if problem:
                yield Problem(
                    "RATE_LIMITS",
                    "JOBQUEUE['RATE_LIMITS'] must map group names of 1 to 200 characters, "
                    "without control characters, to 'N/s', 'N/m', 'N/h' or 'N/d': a group name "
                    f"{problem}.",
                    (group,),
                )
                continue
            try:
                parse_rate(group, rate)
            except ImproperlyConfigured as exc:
                yield Problem("RATE_LIMITS", str(exc), (group,))
    if conf.dynamic_limit is not None and not (
        callable(conf.dynamic_limit) or isinstance(conf.dynamic_limit, str)
    ):
        yield Problem(
            "DYNAMIC_LIMIT",
            "JOBQUEUE['DYNAMIC_LIMIT'] must be a callable or the dotted path of one.",
        )


def _limits(conf: JobQueueSettings) -> Iterator[Problem]:
    """LIMITS, as the limits engine reads it: one message per bad entry, and one per entry
    that governs a resource GROUP_LIMITS, RATE_LIMITS or QUEUE_LIMITS derives."""
    if not isinstance(conf.limits, dict):
        yield from (Problem("LIMITS", m) for m in limits_problems(conf.limits))
        return
    good = {}
    for name, value in conf.limits.items():  # entry by entry, to say which one each is
        problems = [Problem("LIMITS", m, (name,)) for m in limits_problems({name: value})]
        yield from problems
        if not problems:
            good[name] = parse_spec(name, value)
    # "group:<name>" and "queue:<name>" are the resources of the older settings: a LIMITS
    # entry of such a name would count their jobs twice.
    try:
        shorthands = derived(conf)
    except ImproperlyConfigured:  # their own messages say what is wrong with them
        return
    for resource in shorthands:
        found = find(resource, good)
        if found is not None:
            setting = (
                "QUEUE_LIMITS" if resource.startswith("queue:") else "GROUP_LIMITS/RATE_LIMITS"
            )
            yield Problem(
                "LIMITS",
                f"JOBQUEUE['LIMITS'][{found[0]!r}] governs {resource!r}, the resource of "
                f"JOBQUEUE[{setting!r}]; give that limit in one place.",
                (found[0],),
            )


def _schedules(conf: JobQueueSettings) -> Iterator[Problem]:
    """The shape of SCHEDULES; each schedule is checked on its own (schedules.py, E010)."""
    rule = (
        "JOBQUEUE['SCHEDULES'] must map schedule names to dicts (each checked by the system "
        "checks, django_jobqueue.E010)"
    )
    if not isinstance(conf.schedules, dict):
        yield Problem("SCHEDULES", f"{rule}.")
        return
    for name, value in conf.schedules.items():
        if not isinstance(name, str):
            yield Problem("SCHEDULES", f"{rule}: the name {name!r} is not a string.", (name,))
        elif not isinstance(value, dict):
            yield Problem("SCHEDULES", f"{rule}: {name!r} maps to {value!r}.", (name,))


def _retention(conf: JobQueueSettings) -> Iterator[Problem]:
    """RETENTION: final states and their ages."""
    if not isinstance(conf.retention, dict):
        yield Problem(
            "RETENTION",
            "JOBQUEUE['RETENTION'] must map final states (done, cancelled, dead) to ages.",
        )
        return
    for state, age in conf.retention.items():
        if state not in FINAL_STATES:
            yield Problem(
                "RETENTION",
                f"JOBQUEUE['RETENTION'] names {state!r}, which is not a final state "
                f"({', '.join(FINAL_STATES)}).",
                (state,),
            )
        elif age is not None:
            try:
                parse_age(age)
            except ValueError as exc:
                yield Problem("RETENTION", f"JOBQUEUE['RETENTION'][{state!r}]: {exc}", (state,))


def level_number(level: int | str) -> int:
    """A logging level given as a number or as a name logging knows ("INFO"); else ValueError."""
    if isinstance(level, bool) or not isinstance(level, int | str):
        raise ValueError(f"{level!r} is not a logging level")
    if isinstance(level, int):
        if level < 0:
            raise ValueError(f"{level!r} is not a logging level")
        return level
    names = logging.getLevelNamesMapping()
    if level not in names:
        raise ValueError(f"{level!r} is not a logging level ({', '.join(names)})")
    return names[level]


# The longest line ctx.logger keeps (JOB_LOG_MAX_LINE_LENGTH).
MAX_LOG_LINE_LENGTH = 1_000_000


def _job_logs(conf: JobQueueSettings) -> Iterator[Problem]:
    """JOB_LOG_LEVEL, JOB_LOG_MAX_LINES and JOB_LOG_MAX_LINE_LENGTH."""
    try:
        level_number(conf.job_log_level)
    except ValueError:
        yield Problem(
            "JOB_LOG_LEVEL",
            "JOBQUEUE['JOB_LOG_LEVEL'] must be a logging level: a number >= 0 or a name "
            f"logging knows ('INFO', 'WARNING', ...), not {conf.job_log_level!r}.",
        )
    lines = conf.job_log_max_lines
    if isinstance(lines, bool) or not isinstance(lines, int) or not 0 <= lines <= INT_MAX:
        yield Problem(
            "JOB_LOG_MAX_LINES",
            f"JOBQUEUE['JOB_LOG_MAX_LINES'] must be an integer from 0 (keep none) to {INT_MAX}.",
        )
    length = conf.job_log_max_line_length
    if (
        isinstance(length, bool)
        or not isinstance(length, int)
        or not 10 <= length <= MAX_LOG_LINE_LENGTH
    ):
        yield Problem(
            "JOB_LOG_MAX_LINE_LENGTH",
            "JOBQUEUE['JOB_LOG_MAX_LINE_LENGTH'] must be an integer from 10 to "
            f"{MAX_LOG_LINE_LENGTH:,} (characters).",
        )


# The options JOBQUEUE["OPENTELEMETRY"] takes as a dict, with their defaults: whether to trace,
# whether to record metrics, the seconds between two reads of the queue and limit gauges, and
# the resources of LIMITS that count tokens ({resource or pattern: "input" or "output"}).
TELEMETRY_OPTIONS: dict[str, Any] = {
    "TRACES": True,
    "METRICS": True,
    "GAUGE_INTERVAL": 5.0,
    "TOKEN_RESOURCES": {},
}
# The values of the GenAI semantic conventions' `gen_ai.token.type` a resource may count.
TOKEN_TYPES = ("input", "output")


def telemetry_options(value: bool | dict[str, Any]) -> dict[str, Any] | None:
    """The options of an OPENTELEMETRY setting (checked), or None when it is off."""
    if value is False:
        return None
    return {**TELEMETRY_OPTIONS, **(value if isinstance(value, dict) else {})}


def _telemetry(conf: JobQueueSettings) -> Iterator[Problem]:
    """OPENTELEMETRY: True, False, or a dict of TELEMETRY_OPTIONS."""
    value = conf.opentelemetry
    if isinstance(value, bool):
        return
    known = ", ".join(TELEMETRY_OPTIONS)
    if not isinstance(value, dict):
        yield Problem(
            "OPENTELEMETRY",
            f"JOBQUEUE['OPENTELEMETRY'] must be True, False or a dict of options ({known}).",
        )
        return
    for key, option in value.items():
        if key not in TELEMETRY_OPTIONS:
            yield Problem(
                "OPENTELEMETRY",
                f"JOBQUEUE['OPENTELEMETRY'] has an unknown option {key!r}; known: {known}.",
                (key,),
            )
        elif key == "GAUGE_INTERVAL":
            if not finite(option) or not 0 < option <= MAX_INTERVAL:
                yield Problem(
                    "OPENTELEMETRY",
                    "JOBQUEUE['OPENTELEMETRY']['GAUGE_INTERVAL'] must be a positive number of "
                    "seconds.",
                    (key,),
                )
        elif key == "TOKEN_RESOURCES":
            yield from _token_resources(conf, key, option)
        elif not isinstance(option, bool):
            yield Problem(
                "OPENTELEMETRY",
                f"JOBQUEUE['OPENTELEMETRY'][{key!r}] must be True or False.",
                (key,),
            )


def _token_resources(conf: JobQueueSettings, key: str, value: Any) -> Iterator[Problem]:
    """OPENTELEMETRY's TOKEN_RESOURCES: {resource or pattern of LIMITS: "input" or "output"}.
    A resource no limit governs is refused: it would never be granted or settled, and a typo
    would silently report no tokens."""
    where = "JOBQUEUE['OPENTELEMETRY']['TOKEN_RESOURCES']"
    entry = (key,)  # the option, dropped from the usable settings
    if not isinstance(value, dict):
        yield Problem(
            "OPENTELEMETRY",
            f"{where} must map resources of JOBQUEUE['LIMITS'] (or patterns, 'tenant-tokens:*') "
            f"to the type of token they count, 'input' or 'output'; not {value!r}.",
            entry,
        )
        return
    try:  # a LIMITS (or GROUP_LIMITS, ...) that is bad has messages of its own
        specs = {**derived(conf), **parse_limits(conf.limits)}
    except (ImproperlyConfigured, AttributeError):
        specs = None
    for name, kind in value.items():
        problem = name_problem(name, 255, star="end")
        if problem:
            yield Problem("OPENTELEMETRY", f"{where}: a resource name {problem}.", entry)
            continue
        if kind not in TOKEN_TYPES:
            yield Problem(
                "OPENTELEMETRY",
                f"{where}[{name!r}] must be 'input' or 'output' (gen_ai.token.type), not {kind!r}.",
                entry,
            )
        if specs is not None and find(name, specs) is None:
            yield Problem(
                "OPENTELEMETRY",
                f"{where} names {name!r}, which no entry of JOBQUEUE['LIMITS'] governs "
                f"(limited: {', '.join(sorted(specs)) or 'none'}).",
                entry,
            )


# In the order their problems are listed (after the unknown keys).
SECTIONS: tuple[Callable[[JobQueueSettings], Iterable[Problem]], ...] = (
    _times,
    _core,
    _databases,
    _group_limits,
    _limits,
    _schedules,
    _retention,
    _telemetry,
    _job_logs,
)


def dynamic_limit_problems(conf: JobQueueSettings) -> Iterator[str]:
    """Why a dotted DYNAMIC_LIMIT does not give a callable (E004).

    Only the system checks import it here: validating the settings never does (a worker
    imports it when it starts).
    """
    path = conf.dynamic_limit
    if not isinstance(path, str):
        return
    try:
        func = import_string(path)
    except ImportError as exc:
        yield f"JOBQUEUE['DYNAMIC_LIMIT'] {path!r} cannot be imported: {exc}"
    else:
        if not callable(func):
            yield f"JOBQUEUE['DYNAMIC_LIMIT'] {path!r} is not callable."


_current: tuple[Any, Any, JobQueueSettings] | None = None


def get() -> JobQueueSettings:
    """Return the current settings: validated once per JOBQUEUE (and DATABASES) object.

    Cached because enqueue() asks for them every time: validating the dict each time cost
    more than the INSERT. override_settings (or the pytest-django `settings` fixture) puts new
    objects in place, so a change made that way is seen at once; a dict changed in place is
    not.
    """
    global _current
    raw = getattr(settings, "JOBQUEUE", None)
    databases = settings.DATABASES
    current = _current
    if current is None or current[0] is not raw or current[1] is not databases:
        current = _current = (raw, databases, load(raw))
    return current[2]
