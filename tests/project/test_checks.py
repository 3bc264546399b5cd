"""System checks: E001 (settings, every bad value at once), E002 (MySQL/MariaDB version),
W001/W002 (SQLite modes), E003, E004, E010 (schedules) beside E001.

The SQLite warnings are checked on every run, whatever DATABASE_URL names: the queue database
is pointed (JOBQUEUE['DATABASE']) at an extra SQLite alias created for the test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core import checks as django_checks
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

from django_jobqueue import checks
from django_jobqueue.dialects.mysql import version_error
from tests.support.extra_databases import sqlite_alias
from tests.support.markers import only_mysql

ROOT = Path(__file__).resolve().parents[2]
VALID = {"LEASE_TTL": 30, "HEARTBEAT_INTERVAL": 5}


def ids(messages: list[Any]) -> list[str]:
    return [m.id for m in messages]


# --- E001 / E003 -----------------------------------------------------------------------------


def test_test_settings_pass() -> None:
    assert checks.check_settings() == []


@pytest.mark.parametrize(
    ("jobqueue", "text"),
    [
        ({"BOGUS": 1}, "Unknown JOBQUEUE setting 'BOGUS'"),
        ({"lease_ttl": 30}, "Unknown JOBQUEUE setting 'lease_ttl'"),
        ({"LEASE_TTL": 10, "HEARTBEAT_INTERVAL": 6}, "at most half"),
        ({"LEASE_TTL": "30"}, "LEASE_TTL"),
        ({"LEASE_TTL": 0}, "LEASE_TTL"),
        ({"POLL_INTERVAL": -1}, "POLL_INTERVAL"),
        ({"POLL_INTERVAL": True}, "POLL_INTERVAL"),
        ({"MAX_ATTEMPTS": 0}, "MAX_ATTEMPTS"),
        ({"MAX_ATTEMPTS": 2.5}, "MAX_ATTEMPTS"),
        ({"RECLAIM_BATCH": "100"}, "RECLAIM_BATCH"),
        ({"TIMEOUT": 0}, "TIMEOUT"),
        ({"SHUTDOWN_TIMEOUT": -1}, "SHUTDOWN_TIMEOUT"),
        ({"DATABASE": "nope"}, "'nope', which is not in settings.DATABASES"),
        ({"DEFAULT_QUEUE": ""}, "DEFAULT_QUEUE"),
        ({"LISTEN_DATABASE": "nope"}, "'nope', which is not an alias in settings.DATABASES"),
        ({"LISTEN_DATABASE": ["default"]}, "LISTEN_DATABASE"),
        (["LEASE_TTL"], "must be a dict"),
    ],
    ids=lambda v: str(v)[:40],
)
def test_e001_bad_settings(jobqueue: Any, text: str) -> None:
    with override_settings(JOBQUEUE=jobqueue):
        messages = checks.check_settings()
    assert ids(messages) == ["django_jobqueue.E001"]
    assert messages[0].level == django_checks.ERROR
    assert text in messages[0].msg


def test_a_listen_alias_of_the_queue_database_passes() -> None:
    with override_settings(JOBQUEUE={**VALID, "LISTEN_DATABASE": "default"}):
        assert checks.check_settings() == []


@pytest.mark.django_db
def test_e001_for_a_listen_alias_of_another_kind_of_database(tmp_path: Path) -> None:
    with (
        sqlite_alias("sqlite_listen", tmp_path / "listen.sqlite3") as alias,
        override_settings(JOBQUEUE={**VALID, "LISTEN_DATABASE": alias}),
    ):
        messages = checks.check_settings()
    if connection.vendor == "sqlite":
        assert messages == []
    else:
        assert ids(messages) == ["django_jobqueue.E001"]
        assert "'sqlite_listen', a sqlite database" in messages[0].msg


@pytest.mark.django_db  # Django's model checks ask SQLite whether it supports JSON fields
def test_e001_is_reported_by_the_check_framework() -> None:
    with override_settings(JOBQUEUE={"BOGUS": 1}):
        found = django_checks.run_checks()
    assert "django_jobqueue.E001" in ids(found)


@pytest.mark.parametrize(
    "jobqueue", [{"DATABASE": "nope"}, {"DATABASE": ["default"]}, {"database": "x"}, ["x"]]
)
def test_an_unknown_queue_database_skips_the_database_check(jobqueue: Any) -> None:
    with override_settings(JOBQUEUE=jobqueue):
        assert checks.check_database(databases=["default"]) == []


def test_e003_refuses_naive_datetimes() -> None:
    with override_settings(USE_TZ=False):
        messages = checks.check_settings()
    assert ids(messages) == ["django_jobqueue.E003"]
    assert messages[0].level == django_checks.ERROR
    assert "daylight-saving" in messages[0].msg


# --- every bad value at once -----------------------------------------------------------------


def cap(group: str) -> int | None:
    """A DYNAMIC_LIMIT hook (GOOD names it by its dotted path)."""
    return None


MISSING = object()  # a key left out of JOBQUEUE
# For each setting (in the order of the sections): a good value, a bad one, and the messages
# the bad one gets, as (id, text): one for each bad value, each naming its setting.
CASES: dict[str, tuple[Any, Any, list[tuple[str, str]]]] = {
    "LEASE_TTL": (30, 0, [("E001", "JOBQUEUE['LEASE_TTL'] must be a positive number.")]),
    "HEARTBEAT_INTERVAL": (5, -5, [("E001", "JOBQUEUE['HEARTBEAT_INTERVAL'] must be a pos")]),
    "POLL_INTERVAL": (1, True, [("E001", "JOBQUEUE['POLL_INTERVAL'] must be a positive")]),
    "TIMEOUT": (60, float("inf"), [("E001", "JOBQUEUE['TIMEOUT'] must be a positive")]),
    "OPEN_CONTAINER_TIMEOUT": (None, 1e7, [("E001", "CONTAINER_TIMEOUT'] must be at most")]),
    "SHUTDOWN_TIMEOUT": (0, -1, [("E001", "JOBQUEUE['SHUTDOWN_TIMEOUT'] must be a number")]),
    "MAX_ATTEMPTS": (5, 0, [("E001", "JOBQUEUE['MAX_ATTEMPTS'] must be an integer from 1")]),
    "POOL_RETURN": ("query", "transaction", [("E001", "JOBQUEUE['POOL_RETURN'] must be 'job'")]),
    "MAINTENANCE": (False, "yes", [("E001", "JOBQUEUE['MAINTENANCE'] must be True or False")]),
    "PREFETCH": (0, -1, [("E001", "JOBQUEUE['PREFETCH'] must be an integer >= 0.")]),
    "DEFAULT_QUEUE": ("main", "", [("E001", "JOBQUEUE['DEFAULT_QUEUE'] must be a non-empty")]),
    "DATABASE": ("default", "nope", [("E001", "JOBQUEUE['DATABASE'] is 'nope', which is not")]),
    "LISTEN_DATABASE": ("default", "gone", [("E001", "JOBQUEUE['LISTEN_DATABASE'] is 'gone'")]),
    "GROUP_LIMITS": (
        {"free": 2, "paid": 8},
        {"free": 0, "paid": 8, "vip\x1b": 1},
        [
            ("E001", "JOBQUEUE['GROUP_LIMITS'] must map names of 1 to 200 characters (no "
             "control characters) to integers from 1 to 2147483647: 'free' maps to 0."),
            ("E001", "JOBQUEUE['GROUP_LIMITS'] must map names of 1 to 200 characters (no "
             "control characters) to integers from 1 to 2147483647: a name must not contain"),
        ],
    ),
    "QUEUE_LIMITS": ({"bulk": 4}, {"bulk": 2**31}, [("E001", "bulk' maps to 2147483648.")]),
    "RATE_LIMITS": (
        {"api": "60/m", "mail": "5/s"},
        {"api": "60/w", "mail": "5/s", "": "1/s"},
        [
            ("E001", "JOBQUEUE['RATE_LIMITS']['api'] is '60/w'; use 'N/s', 'N/m', 'N/h' or 'N/d'"),
            ("E001", "JOBQUEUE['RATE_LIMITS'] must map group names of 1 to 200 characters"),
        ],
    ),
    "DYNAMIC_LIMIT": (
        "tests.project.test_checks.cap",
        "tests.nowhere.cap",
        [("E004", "JOBQUEUE['DYNAMIC_LIMIT'] 'tests.nowhere.cap' cannot be imported")],
    ),
    "LIMITS": (
        {"openai": {"concurrency": 2}, "tenant:*": {"rate": "10/s"}, "smtp": {"concurrency": 1}},
        {"openai": {"concurrency": 0}, "tenant:*": {"rate": "10/w"}, "smtp": {"concurrency": 1}},
        [
            ("E001", "JOBQUEUE['LIMITS']['openai']['concurrency'] must be an integer"),
            ("E001", "JOBQUEUE['LIMITS']['tenant:*'] is '10/w'"),
        ],
    ),
    "SCHEDULES": (
        {
            "nightly": {"handler": "test.add", "cron": "0 3 * * *", "args": {"a": 1, "b": 2}},
            # Its queue is DEFAULT_QUEUE, its uses a LIMITS entry: checked against the good ones.
            "poll": {"handler": "test.noop", "every": 30, "uses": {"smtp": 1}},
        },
        {
            "nightly": {"handler": "test.add", "cron": "61 * * * *"},
            "poll": {"handler": "test.noop", "every": 30, "uses": {"smtp": 1}},
            "ghost": {"handler": "no.such", "every": 5},
            "text": "every minute",
        },
        [
            ("E010", "JOBQUEUE['SCHEDULES']['nightly']: 'cron' '61 * * * *' is not a valid"),
            ("E010", "JOBQUEUE['SCHEDULES']['ghost']: No handler is registered"),
            ("E001", "JOBQUEUE['SCHEDULES'] must map schedule names to dicts"),
        ],
    ),
    "RETENTION": (
        {"done": "7d", "dead": None},
        {"done": "soon", "week": "7d", "dead": None},
        [
            ("E001", "JOBQUEUE['RETENTION']['done']: 'soon' is not an age"),
            ("E001", "JOBQUEUE['RETENTION'] names 'week', which is not a final state"),
        ],
    ),
    "LEASE_TLL": (MISSING, 30, [("E001", "Unknown JOBQUEUE setting 'LEASE_TLL'; known:")]),
}  # fmt: skip


def jobqueue_with(bad: set[str]) -> dict[str, Any]:
    """JOBQUEUE with the bad value of each setting in `bad`, the good one of the others."""
    chosen = {key: case[1] if key in bad else case[0] for key, case in CASES.items()}
    return {key: value for key, value in chosen.items() if value is not MISSING}


def reported(jobqueue: dict[str, Any]) -> list[Any]:
    """What the checks that need no database say of `jobqueue`."""
    with override_settings(JOBQUEUE=jobqueue):
        return [*checks.check_settings(), *checks.check_schedules()]


def expected(bad: set[str]) -> list[tuple[str, str]]:
    return [(f"django_jobqueue.{i}", text) for key in bad for i, text in CASES[key][2]]


def assert_reports(found: list[Any], wanted: list[tuple[str, str]]) -> None:
    """Each wanted message is reported once, and nothing else."""
    for check_id, text in wanted:
        matches = [m for m in found if m.id == check_id and text in m.msg]
        assert len(matches) == 1, (check_id, text, [m.msg for m in found])
        assert isinstance(matches[0], django_checks.Error)
    assert len(found) == len(wanted), [m.msg for m in found]


def test_every_bad_value_of_every_section_is_reported_at_once() -> None:
    found = reported(jobqueue_with(set(CASES)))
    assert_reports(found, expected(set(CASES)))
    (unknown,) = [m for m in found if "LEASE_TLL" in m.msg]
    assert unknown.hint == "Did you mean 'LEASE_TTL'?"


def test_fixing_one_setting_takes_away_its_messages_only() -> None:
    bad = set(CASES)
    for key in CASES:
        bad.discard(key)
        assert_reports(reported(jobqueue_with(bad)), expected(bad))
    assert reported(jobqueue_with(set())) == []  # the good configuration


def test_a_bad_value_alone_gets_the_id_and_message_it_gets_among_the_others() -> None:
    together = {(m.id, m.msg) for m in reported(jobqueue_with(set(CASES)))}
    alone = set()
    for key in CASES:
        found = reported(jobqueue_with({key}))
        assert_reports(found, expected({key}))  # as today: its id, and only it
        alone |= {(m.id, m.msg) for m in found}
    assert alone == together


@pytest.mark.django_db
def test_the_database_checks_run_beside_other_bad_settings(sqlite_queue: str) -> None:
    with override_settings(JOBQUEUE={**VALID, "DATABASE": sqlite_queue, "RETENTION": []}):
        assert ids(checks.check_settings()) == ["django_jobqueue.E001"]
        found = checks.check_database(databases=[sqlite_queue])
    assert ids(found) == ["django_jobqueue.W001", "django_jobqueue.W002"]


# --- W001 / W002: SQLite journal and transaction modes ---------------------------------------


@pytest.fixture
def sqlite_queue(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A queue database on an extra SQLite file with the OPTIONS given by the test's param."""
    options = getattr(request, "param", {})
    with (
        sqlite_alias("sqlite_queue", tmp_path / "queue.sqlite3", options=options) as alias,
        override_settings(JOBQUEUE={**VALID, "DATABASE": alias}),
    ):
        yield alias


@pytest.mark.django_db
def test_w001_and_w002_for_a_default_sqlite_database(sqlite_queue: str) -> None:
    messages = checks.check_database(databases=[sqlite_queue])
    assert ids(messages) == ["django_jobqueue.W001", "django_jobqueue.W002"]
    assert all(m.level == django_checks.WARNING for m in messages)
    assert "'sqlite_queue' is not in WAL mode" in messages[0].msg
    assert "journal_mode=WAL" in messages[0].hint
    assert "'transaction_mode': 'IMMEDIATE'" in messages[1].hint


@pytest.mark.parametrize(
    "sqlite_queue",
    [{"init_command": "PRAGMA journal_mode=WAL;"}],
    indirect=True,
)
@pytest.mark.django_db
def test_w002_only_when_wal_but_deferred(sqlite_queue: str) -> None:
    assert ids(checks.check_database(databases=[sqlite_queue])) == ["django_jobqueue.W002"]


@pytest.mark.parametrize("sqlite_queue", [{"transaction_mode": "IMMEDIATE"}], indirect=True)
@pytest.mark.django_db
def test_w001_only_when_immediate_but_not_wal(sqlite_queue: str) -> None:
    assert ids(checks.check_database(databases=[sqlite_queue])) == ["django_jobqueue.W001"]


@pytest.mark.parametrize(
    "sqlite_queue",
    [
        {"init_command": "PRAGMA journal_mode=WAL;", "transaction_mode": "IMMEDIATE"},
        {"init_command": "PRAGMA journal_mode=wal;", "transaction_mode": "immediate"},
    ],
    indirect=True,
)
@pytest.mark.django_db
def test_no_warning_for_wal_and_immediate(sqlite_queue: str) -> None:
    assert checks.check_database(databases=[sqlite_queue]) == []


@pytest.mark.django_db
def test_in_memory_sqlite_is_not_warned_about(tmp_path: Path) -> None:
    with (
        sqlite_alias("memory_queue", Path(":memory:")) as alias,
        override_settings(JOBQUEUE={**VALID, "DATABASE": alias}),
    ):
        assert checks.check_database(databases=[alias]) == []


@pytest.mark.django_db
def test_database_check_only_runs_for_the_queue_database(sqlite_queue: str) -> None:
    assert checks.check_database(databases=None) == []
    assert checks.check_database(databases=["default"]) == []


@pytest.mark.django_db
def test_the_test_database_passes_the_database_check() -> None:
    """WAL + IMMEDIATE on SQLite, a new enough server on MySQL/MariaDB, nothing on PostgreSQL."""
    assert checks.check_database(databases=["default"]) == []


# --- E002: MySQL / MariaDB versions ----------------------------------------------------------


@pytest.mark.parametrize(
    ("is_mariadb", "version", "ok"),
    [
        (False, (5, 7, 44), False),
        (False, (8, 0, 0), False),
        (False, (8, 0, 1), True),
        (False, (8, 4, 3), True),
        (False, (9, 1, 0), True),
        (True, (10, 5, 27), False),
        (True, (10, 6, 0), True),
        (True, (10, 11, 9), True),
        (True, (11, 4, 2), True),
    ],
)
def test_version_error(is_mariadb: bool, version: tuple[int, ...], ok: bool) -> None:
    problem = version_error(is_mariadb, version)
    if ok:
        assert problem is None
    else:
        assert problem is not None
        flavour = "MariaDB" if is_mariadb else "MySQL"
        assert f"{flavour} {'.'.join(map(str, version))} is too old" in problem
        assert "SKIP LOCKED" in problem


@only_mysql("E002 needs a MySQL/MariaDB server")
@pytest.mark.django_db
def test_no_e002_for_the_live_server() -> None:
    connection.ensure_connection()
    assert version_error(connection.mysql_is_mariadb, connection.mysql_version) is None
    assert checks.check_database(databases=["default"]) == []


# --- the whole framework, as `manage.py check` runs it ---------------------------------------


@pytest.mark.django_db
def test_call_command_check_fail_level_warning() -> None:
    call_command("check", fail_level="WARNING", databases=["default"], verbosity=0)


@pytest.mark.django_db(transaction=True)
def test_manage_py_check_fail_level_warning() -> None:
    """`python -m django check --fail-level WARNING` on the test settings, in a fresh process."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    # With --database the database checks run too: point the process at the test database.
    env["JOBQUEUE_TEST_SUBPROCESS"] = "1"
    for extra in ([], ["--database", "default"]):
        result = subprocess.run(
            [sys.executable, "-m", "django", "check", "--fail-level", "WARNING", *extra],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "System check identified no issues" in result.stdout


@pytest.mark.django_db
def test_mysql_isolation_other_than_read_committed_warns() -> None:
    from django.db import connection

    if connection.vendor != "mysql":
        pytest.skip("MySQL/MariaDB only")
    from django_jobqueue.checks import check_database

    options = connection.settings_dict.setdefault("OPTIONS", {})
    options["isolation_level"] = "repeatable read"
    try:
        ids = [m.id for m in check_database(databases=["default"])]
    finally:
        del options["isolation_level"]
    assert "django_jobqueue.W004" in ids
    assert "django_jobqueue.W004" not in [m.id for m in check_database(databases=["default"])]
