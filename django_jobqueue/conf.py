"""One place that reads ``settings.JOBQUEUE``, with typed defaults."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from .exceptions import InvalidJobError
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

    def retention_ages(self) -> dict[str, dt.timedelta]:
        """The states RETENTION prunes, with their ages."""
        return {s: parse_age(a) for s, a in self.retention.items() if a is not None}


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


def load(raw: dict[str, Any] | None = None) -> JobQueueSettings:
    """Build the settings from a ``JOBQUEUE`` dict, raising ImproperlyConfigured on bad values."""
    if raw is None:
        raw = getattr(settings, "JOBQUEUE", {}) or {}
    if not isinstance(raw, dict):
        raise ImproperlyConfigured("settings.JOBQUEUE must be a dict.")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        name = key.lower() if isinstance(key, str) else ""
        if not name or not key.isupper() or name not in _FIELDS:
            known = ", ".join(sorted(n.upper() for n in _FIELDS))
            raise ImproperlyConfigured(f"Unknown JOBQUEUE setting {key!r}; known: {known}.")
        values[name] = value
    conf = JobQueueSettings(**values)
    _validate(conf)
    return conf


def _validate(conf: JobQueueSettings) -> None:
    def positive(name: str, allow_none: bool = False) -> None:
        value = getattr(conf, name)
        if value is None and allow_none:
            return
        if not finite(value) or value <= 0:
            raise ImproperlyConfigured(f"JOBQUEUE[{name.upper()!r}] must be a positive number.")
        if name != "timeout" and value > MAX_INTERVAL:
            raise ImproperlyConfigured(
                f"JOBQUEUE[{name.upper()!r}] must be at most {MAX_INTERVAL:,.0f} seconds "
                f"(about 11.6 days), not {value!r}."
            )

    for name in (
        "lease_ttl",
        "heartbeat_interval",
        "poll_interval",
        "retry_backoff",
        "retry_backoff_max",
        "reclaim_interval",
        "fair_share_refresh",
        "lock_timeout",
    ):
        positive(name)
    positive("timeout", allow_none=True)
    positive("open_container_timeout", allow_none=True)
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
            raise ImproperlyConfigured(
                f"JOBQUEUE[{name.upper()!r}] must be an integer from 1 to {INT_MAX}."
            )
    if not finite(conf.shutdown_timeout) or not 0 <= conf.shutdown_timeout <= MAX_INTERVAL:
        raise ImproperlyConfigured(
            "JOBQUEUE['SHUTDOWN_TIMEOUT'] must be a number of seconds from 0 to "
            f"{MAX_INTERVAL:,.0f} (about 11.6 days)."
        )
    for name in ("group_limits", "queue_limits"):
        limits = getattr(conf, name)
        # The names are stored in a 255-character column (Limit.name, "group:<name>").
        if not isinstance(limits, dict) or not all(
            name_problem(k, 200) is None
            and isinstance(v, int)
            and not isinstance(v, bool)
            and 1 <= v <= INT_MAX
            for k, v in limits.items()
        ):
            raise ImproperlyConfigured(
                f"JOBQUEUE[{name.upper()!r}] must map names of 1 to 200 characters (no "
                f"control characters) to integers from 1 to {INT_MAX}."
            )
    if conf.pool_return not in ("job", "query"):
        raise ImproperlyConfigured("JOBQUEUE['POOL_RETURN'] must be 'job' or 'query'.")
    if not isinstance(conf.maintenance, bool):
        raise ImproperlyConfigured("JOBQUEUE['MAINTENANCE'] must be True or False.")
    if isinstance(conf.prefetch, bool) or not isinstance(conf.prefetch, int) or conf.prefetch < 0:
        raise ImproperlyConfigured("JOBQUEUE['PREFETCH'] must be an integer >= 0.")
    if conf.dynamic_limit is not None and not (
        callable(conf.dynamic_limit) or isinstance(conf.dynamic_limit, str)
    ):
        raise ImproperlyConfigured(
            "JOBQUEUE['DYNAMIC_LIMIT'] must be a callable or the dotted path of one."
        )
    if not isinstance(conf.database, str):
        raise ImproperlyConfigured(
            f"JOBQUEUE['DATABASE'] must be a database alias (a string), not {conf.database!r}."
        )
    if not isinstance(conf.schedules, dict) or not all(
        isinstance(k, str) and isinstance(v, dict) for k, v in conf.schedules.items()
    ):
        raise ImproperlyConfigured(
            "JOBQUEUE['SCHEDULES'] must map schedule names to dicts (each checked by the "
            "system checks, django_jobqueue.E010)."
        )
    if not isinstance(conf.rate_limits, dict):
        raise ImproperlyConfigured("JOBQUEUE['RATE_LIMITS'] must map group names to 'N/period'.")
    for group, rate in conf.rate_limits.items():
        # A group's rate has a lock row named "group:<name>" in a 255-character column, as a
        # GROUP_LIMITS entry has: the same 200 characters at most.
        problem = name_problem(group, 200)
        if problem:
            raise ImproperlyConfigured(
                "JOBQUEUE['RATE_LIMITS'] must map group names of 1 to 200 characters, without "
                f"control characters, to 'N/s', 'N/m' or 'N/h': a group name {problem}."
            )
        parse_rate(group, rate)
    from .limits import derived, find, parse_limits  # limits reads parse_rate from here

    entries = parse_limits(conf.limits)
    # GROUP_LIMITS, RATE_LIMITS and QUEUE_LIMITS are the resources "group:<name>" and
    # "queue:<name>" of the same engine: a LIMITS entry of such a name would count them twice.
    for name in derived(conf):
        found = find(name, entries)
        if found is not None:
            setting = "QUEUE_LIMITS" if name.startswith("queue:") else "GROUP_LIMITS/RATE_LIMITS"
            raise ImproperlyConfigured(
                f"JOBQUEUE['LIMITS'][{found[0]!r}] governs {name!r}, the resource of "
                f"JOBQUEUE[{setting!r}]; give that limit in one place."
            )
    if conf.schedule_clock is not None and not (
        callable(conf.schedule_clock) or isinstance(conf.schedule_clock, str)
    ):
        raise ImproperlyConfigured(
            "JOBQUEUE['SCHEDULE_CLOCK'] must be a callable or the dotted path of one."
        )
    _validate_retention(conf.retention)
    if conf.heartbeat_interval * 2 > conf.lease_ttl:
        raise ImproperlyConfigured(
            "JOBQUEUE['HEARTBEAT_INTERVAL'] must be at most half of JOBQUEUE['LEASE_TTL'], "
            "so one missed heartbeat does not lose a live lease."
        )
    if conf.database not in settings.DATABASES:
        raise ImproperlyConfigured(
            f"JOBQUEUE['DATABASE'] is {conf.database!r}, which is not in settings.DATABASES."
        )
    if conf.listen_database is not None and (
        not isinstance(conf.listen_database, str) or conf.listen_database not in settings.DATABASES
    ):
        raise ImproperlyConfigured(
            f"JOBQUEUE['LISTEN_DATABASE'] is {conf.listen_database!r}, which is not an alias in "
            "settings.DATABASES (it names the connection, straight to the queue's PostgreSQL "
            "database, that the workers LISTEN on; leave it out to use JOBQUEUE['DATABASE'])."
        )
    if conf.listen_database is not None:
        from django.db import connections

        listen, queue = connections[conf.listen_database].vendor, connections[conf.database].vendor
        if listen != queue:
            raise ImproperlyConfigured(
                f"JOBQUEUE['LISTEN_DATABASE'] is {conf.listen_database!r}, a {listen} database, "
                f"but the queue database {conf.database!r} is {queue}: it must be another alias "
                "of the same database."
            )
    try:  # the checks enqueue() makes of a queue name: every enqueue would fail otherwise
        check_label("queue", conf.default_queue, 100)
    except InvalidJobError as exc:
        raise ImproperlyConfigured(
            "JOBQUEUE['DEFAULT_QUEUE'] must be a non-empty string of at most 100 characters, "
            f"without NUL or control characters: {exc}"
        ) from None


RATE_PERIODS = {"s": 1, "m": 60, "h": 3600}


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
            f"JOBQUEUE[{setting!r}][{group!r}] is {rate!r}; use 'N/s', 'N/m' or 'N/h' with "
            f"a whole N from 1 to {INT_MAX} (at most N starts in any window of that length)."
        )
    return int(count), RATE_PERIODS[period]


def _validate_retention(retention: Any) -> None:
    if not isinstance(retention, dict):
        raise ImproperlyConfigured(
            "JOBQUEUE['RETENTION'] must map final states (done, cancelled, dead) to ages."
        )
    for state, age in retention.items():
        if state not in FINAL_STATES:
            raise ImproperlyConfigured(
                f"JOBQUEUE['RETENTION'] names {state!r}, which is not a final state "
                f"({', '.join(FINAL_STATES)})."
            )
        if age is not None:
            try:
                parse_age(age)
            except ValueError as exc:
                raise ImproperlyConfigured(f"JOBQUEUE['RETENTION'][{state!r}]: {exc}") from None


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
