"""settings.JOBQUEUE: typed defaults, overrides, and ImproperlyConfigured on bad values."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from hypothesis import given
from hypothesis import strategies as st

from django_jobqueue import conf, limits
from django_jobqueue.conf import JobQueueSettings

DEFAULTS = {
    "database": "default",
    "default_queue": "default",
    "max_attempts": 3,
    "timeout": None,
    "lease_ttl": 30.0,
    "heartbeat_interval": 10.0,
    "poll_interval": 1.0,
    "shutdown_timeout": 30.0,
    "retry_backoff": 2.0,
    "retry_backoff_max": 3600.0,
    "reclaim_interval": 1.0,
    "reclaim_batch": 100,
    "max_abandoned_threads": 3,
}


def test_defaults() -> None:
    loaded = conf.load({})
    assert loaded == JobQueueSettings()
    values = dataclasses.asdict(loaded)
    # Settings added later keep their own defaults; the documented ones must not drift.
    assert {k: values[k] for k in DEFAULTS} == DEFAULTS


@pytest.mark.parametrize("raw", [None, {}])
def test_missing_or_empty_setting_means_defaults(raw: Any) -> None:
    with override_settings(JOBQUEUE=raw):
        assert conf.get() == JobQueueSettings()


def test_without_the_setting_at_all(settings: Any) -> None:
    del settings.JOBQUEUE
    assert conf.get() == JobQueueSettings()


def test_test_settings_are_read() -> None:
    current = conf.get()
    assert current.lease_ttl == 30
    assert current.heartbeat_interval == 5
    assert current.poll_interval == 0.05
    assert current.retry_backoff_max == 0.5
    assert current.max_attempts == 3  # not set: the default


def test_override_settings_is_seen_at_once() -> None:
    with override_settings(JOBQUEUE={"MAX_ATTEMPTS": 7, "DEFAULT_QUEUE": "bulk", "TIMEOUT": 2.5}):
        current = conf.get()
        assert (current.max_attempts, current.default_queue, current.timeout) == (7, "bulk", 2.5)
        assert current.lease_ttl == 30.0  # unset keys keep their defaults
    assert conf.get().max_attempts == 3


def test_settings_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        conf.get().lease_ttl = 1  # type: ignore[misc]


def test_every_field_is_a_setting() -> None:
    raw = {
        f.name.upper(): getattr(JobQueueSettings(), f.name)
        for f in dataclasses.fields(JobQueueSettings)
    }
    assert conf.load(raw) == JobQueueSettings()


@pytest.mark.parametrize(
    "raw",
    [
        {"LEASE_TTL": 1, "HEARTBEAT_INTERVAL": 0.5},
        {"TIMEOUT": None},
        {"TIMEOUT": 0.1},
        {"SHUTDOWN_TIMEOUT": 0},
        {"MAX_ATTEMPTS": 1},
        {"RECLAIM_BATCH": 1, "MAX_ABANDONED_THREADS": 1},
        {"POLL_INTERVAL": 1},  # ints are fine where seconds are expected
        {"POOL_RETURN": "query"},
    ],
    ids=str,
)
def test_valid_values(raw: dict[str, Any]) -> None:
    loaded = conf.load(raw)
    for key, value in raw.items():
        assert getattr(loaded, key.lower()) == value


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        ({"BOGUS": 1}, "Unknown JOBQUEUE setting 'BOGUS'; known: DATABASE,"),
        ({"lease_ttl": 30}, "Unknown JOBQUEUE setting 'lease_ttl'"),
        ({"Lease_Ttl": 30}, "Unknown"),
        ({"LEASE_TTL": 0}, "LEASE_TTL"),
        ({"LEASE_TTL": -1}, "LEASE_TTL"),
        ({"LEASE_TTL": "30"}, "LEASE_TTL"),
        ({"LEASE_TTL": None}, "LEASE_TTL"),
        ({"HEARTBEAT_INTERVAL": True}, "HEARTBEAT_INTERVAL"),
        ({"HEARTBEAT_INTERVAL": 16}, "at most half"),
        ({"LEASE_TTL": 10, "HEARTBEAT_INTERVAL": 5.01}, "at most half"),
        ({"POLL_INTERVAL": 0}, "POLL_INTERVAL"),
        ({"LEASE_TTL": float("nan")}, "LEASE_TTL"),
        ({"LEASE_TTL": float("inf")}, "LEASE_TTL"),
        ({"TIMEOUT": float("inf")}, "TIMEOUT"),
        ({"RETRY_BACKOFF": -2}, "RETRY_BACKOFF"),
        ({"RETRY_BACKOFF_MAX": 0}, "RETRY_BACKOFF_MAX"),
        ({"RECLAIM_INTERVAL": "1"}, "RECLAIM_INTERVAL"),
        ({"TIMEOUT": 0}, "TIMEOUT"),
        ({"TIMEOUT": -1}, "TIMEOUT"),
        ({"TIMEOUT": "60"}, "TIMEOUT"),
        ({"MAX_ATTEMPTS": 0}, "MAX_ATTEMPTS"),
        ({"MAX_ATTEMPTS": 1.0}, "MAX_ATTEMPTS"),
        ({"MAX_ATTEMPTS": True}, "MAX_ATTEMPTS"),
        ({"RECLAIM_BATCH": 0}, "RECLAIM_BATCH"),
        ({"MAX_ABANDONED_THREADS": "3"}, "MAX_ABANDONED_THREADS"),
        ({"SHUTDOWN_TIMEOUT": -0.5}, "SHUTDOWN_TIMEOUT"),
        ({"SHUTDOWN_TIMEOUT": "30"}, "SHUTDOWN_TIMEOUT"),
        ({"SHUTDOWN_TIMEOUT": True}, "SHUTDOWN_TIMEOUT"),
        ({"DATABASE": "replica"}, "'replica', which is not in settings.DATABASES"),
        ({"DEFAULT_QUEUE": ""}, "DEFAULT_QUEUE"),
        ({"DEFAULT_QUEUE": 5}, "DEFAULT_QUEUE"),
        ({"DEFAULT_QUEUE": "q" * 101}, "at most 100 characters"),  # the queue column's size
        # Accepted once, then every enqueue (or every duty of the worker) failed:
        ({"DEFAULT_QUEUE": "a\x00b"}, "NUL"),
        ({"DEFAULT_QUEUE": "a\x1bb"}, "control characters"),
        ({"POLL_INTERVAL": 9.3e9}, "at most 1,000,000 seconds"),
        ({"LOCK_TIMEOUT": 1e12}, "LOCK_TIMEOUT'] must be at most 1,000,000 seconds"),
        ({"LEASE_TTL": 1e12, "HEARTBEAT_INTERVAL": 10}, "LEASE_TTL'] must be at most"),
        ({"RECLAIM_INTERVAL": 1e7}, "RECLAIM_INTERVAL'] must be at most"),
        ({"FAIR_SHARE_REFRESH": 1e7}, "FAIR_SHARE_REFRESH'] must be at most"),
        ({"SHUTDOWN_TIMEOUT": 1e7}, "SHUTDOWN_TIMEOUT"),
        ({"RATE_LIMITS": {"g": "\u00b2/s"}}, "RATE_LIMITS']['g']"),
        ({"RATE_LIMITS": {"g": "\u0663/s"}}, "RATE_LIMITS']['g']"),  # an Arabic-Indic 3
        ({"RATE_LIMITS": {"g": f"{2**31}/s"}}, "a whole N from 1 to 2147483647"),
        ({"RATE_LIMITS": {"g\x1b": "1/s"}}, "without control characters"),
        ({"GROUP_LIMITS": {"g\r": 1}}, "no control characters"),
        ({"QUEUE_LIMITS": {"q\u202e": 1}}, "no control characters"),
        ({"POOL_RETURN": "transaction"}, "POOL_RETURN'] must be 'job' or 'query'"),
        # Integers too large for a float: refused, where math.isfinite() raised OverflowError.
        ({"LEASE_TTL": 10**400}, "LEASE_TTL'] must be a positive number"),
        ({"POLL_INTERVAL": 10**400}, "POLL_INTERVAL'] must be a positive number"),
        ({"TIMEOUT": 10**400}, "TIMEOUT'] must be a positive number"),
        ({"OPEN_CONTAINER_TIMEOUT": 10**400}, "OPEN_CONTAINER_TIMEOUT'] must be a positive"),
        ({"SHUTDOWN_TIMEOUT": 10**400}, "SHUTDOWN_TIMEOUT"),
        ({"RETENTION": {"done": 10**400}}, "RETENTION']['done']"),
        # A group's rate lock row is "group:<name>" in a 255-character column.
        ({"RATE_LIMITS": {"g" * 201: "1/s"}}, "a group name must be at most 200 characters"),
    ],
    ids=lambda raw: str(raw)[:80],
)
def test_invalid_values(raw: dict[str, Any], text: str) -> None:
    with pytest.raises(ImproperlyConfigured) as info:
        conf.load(raw)
    assert text in str(info.value)
    with override_settings(JOBQUEUE=raw), pytest.raises(ImproperlyConfigured):
        conf.get()


@pytest.mark.parametrize("raw", [["LEASE_TTL", 30], "LEASE_TTL=30", 30])
def test_setting_must_be_a_dict(raw: Any) -> None:
    with override_settings(JOBQUEUE=raw), pytest.raises(ImproperlyConfigured, match="dict"):
        conf.get()


def test_the_upper_bounds_themselves_are_accepted() -> None:
    top = conf.MAX_INTERVAL
    loaded = conf.load(
        {"LEASE_TTL": top, "HEARTBEAT_INTERVAL": top / 2, "POLL_INTERVAL": top,
         "LOCK_TIMEOUT": top, "SHUTDOWN_TIMEOUT": top, "RATE_LIMITS": {"g": "2147483647/h"}}
    )  # fmt: skip
    assert (loaded.lease_ttl, loaded.lock_timeout) == (top, top)


@given(
    lease_ttl=st.floats(min_value=0.001, max_value=1e6),
    heartbeat=st.floats(min_value=0.001, max_value=1e6),
)
def test_heartbeat_must_fit_twice_in_the_lease(lease_ttl: float, heartbeat: float) -> None:
    raw = {"LEASE_TTL": lease_ttl, "HEARTBEAT_INTERVAL": heartbeat}
    if heartbeat * 2 <= lease_ttl:
        assert conf.load(raw).heartbeat_interval == heartbeat
    else:
        with pytest.raises(ImproperlyConfigured, match="at most half"):
            conf.load(raw)


# --- every bad value at once ------------------------------------------------------------------

SEVERAL = {
    "LEASE_TTL": 0,
    "MAX_ATTEMPTS": 0,
    "BOGUS": 1,
    "GROUP_LIMITS": {"free": 0, "paid": 8, "vip": -1},
    "LIMITS": {"openai": {"concurrency": 0}, "smtp": {"concurrency": 1}},
    "RETENTION": {"week": "7d", "done": "1d"},
    "SCHEDULES": {"poll": {"handler": "test.noop", "every": 30}, "text": "every minute"},
}


def test_load_raises_every_bad_value_in_one_error() -> None:
    with pytest.raises(ImproperlyConfigured) as info:
        conf.load(SEVERAL)
    lines = str(info.value).splitlines()
    assert lines[0] == "settings.JOBQUEUE has 8 problems:"
    assert [line[:2] for line in lines[1:]] == ["- "] * 8
    for text in (
        "JOBQUEUE['LEASE_TTL'] must be a positive number.",
        "JOBQUEUE['MAX_ATTEMPTS'] must be an integer from 1 to 2147483647.",
        "Unknown JOBQUEUE setting 'BOGUS'",
        "integers from 1 to 2147483647: 'free' maps to 0.",
        "integers from 1 to 2147483647: 'vip' maps to -1.",
        "JOBQUEUE['LIMITS']['openai']['concurrency'] must be",
        "JOBQUEUE['RETENTION'] names 'week'",
        "JOBQUEUE['SCHEDULES'] must map schedule names to dicts (each checked by the system "
        "checks, django_jobqueue.E010): 'text' maps to 'every minute'.",
    ):
        assert sum(text in line for line in lines) == 1, text
    # The start-up paths (the worker, enqueue) raise the same error from conf.get().
    with override_settings(JOBQUEUE=SEVERAL), pytest.raises(ImproperlyConfigured) as again:
        conf.get()
    assert str(again.value) == str(info.value)
    # One bad value: its message alone, as before.
    with pytest.raises(ImproperlyConfigured) as one:
        conf.load({"LEASE_TTL": 0})
    assert str(one.value) == "JOBQUEUE['LEASE_TTL'] must be a positive number."


def test_examine_names_each_bad_value_and_leaves_it_out() -> None:
    found, usable = conf.examine(SEVERAL)
    assert [(p.setting, p.entry) for p in found] == [
        ("BOGUS", ()),
        ("LEASE_TTL", ()),
        ("MAX_ATTEMPTS", ()),
        ("GROUP_LIMITS", ("free",)),
        ("GROUP_LIMITS", ("vip",)),
        ("LIMITS", ("openai",)),
        ("SCHEDULES", ("text",)),
        ("RETENTION", ("week",)),
    ]
    # A bad setting takes its default, a bad entry is dropped, the good values are kept.
    assert (usable.lease_ttl, usable.max_attempts) == (30.0, 3)
    assert usable.group_limits == {"paid": 8}
    assert usable.limits == {"smtp": {"concurrency": 1}}
    assert usable.retention == {"done": "1d"}
    assert usable.schedules == {"poll": {"handler": "test.noop", "every": 30}}
    assert conf.examine({"LEASE_TTL": 40}) == ([], conf.load({"LEASE_TTL": 40}))
    assert conf.examine(["LEASE_TTL"]) == ([conf.Problem("", "settings.JOBQUEUE must be a dict.")],
                                           JobQueueSettings())  # fmt: skip


def test_limits_problems_says_every_bad_entry_and_parse_limits_raises_the_first() -> None:
    raw = {"a": {"concurrency": 0}, "b": {"concurrency": 1}, "c*d": {"rate": "1/s"}}
    found = list(limits.limits_problems(raw))
    assert len(found) == 2
    assert found[0].startswith("JOBQUEUE['LIMITS']['a']['concurrency'] must be")
    assert "a '*' only at the end" in found[1]
    with pytest.raises(ImproperlyConfigured) as info:
        limits.parse_limits(raw)
    assert str(info.value) == found[0]
    assert list(limits.limits_problems({"b": {"concurrency": 1}})) == []
