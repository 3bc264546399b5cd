"""Settings for the test suite; the database comes from DATABASE_URL (default: an SQLite file)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent
STATE_DIR = Path(os.environ.get("JOBQUEUE_TEST_STATE", BASE_DIR / ".test-state"))
STATE_DIR.mkdir(exist_ok=True)

env = environ.Env()
# One test database per pytest run, so that concurrent runs never drop each other's database;
# os.environ carries the id to the worker subprocesses that a run starts.
RUN_ID = os.environ.setdefault("JOBQUEUE_TEST_RUN_ID", str(os.getpid()))
DATABASE_URL = os.environ.get("DATABASE_URL") or f"sqlite:///{STATE_DIR / 'jobqueue.sqlite3'}"
_db = env.db_url_config(DATABASE_URL)
_engine = _db["ENGINE"]
if _engine.endswith("sqlite3"):
    # A busy timeout of 30 s, not Django's 5 s, for the connections the worker does not bound
    # itself (the test process, handlers, producers): a loaded machine can keep the holder of
    # the write lock off the CPU for seconds.
    _db.setdefault("OPTIONS", {}).update(
        {"init_command": "PRAGMA journal_mode=WAL;", "transaction_mode": "IMMEDIATE", "timeout": 30}
    )
    if os.environ.get("JOBQUEUE_TEST_SQLITE_DEFERRED"):  # a project without IMMEDIATE
        del _db["OPTIONS"]["transaction_mode"]
    # A file, never :memory:: worker subprocesses must see the same database.
    _db["TEST"] = {"NAME": str(STATE_DIR / f"test_{RUN_ID}.sqlite3")}
elif _engine.endswith("mysql"):
    _db.setdefault("OPTIONS", {}).update({"charset": "utf8mb4"})
    _db["TEST"] = {"CHARSET": "utf8mb4", "COLLATION": "utf8mb4_unicode_ci"}
if not _engine.endswith("sqlite3"):
    _db.setdefault("TEST", {})["NAME"] = f"test_{_db['NAME']}_{RUN_ID}"
# Worker subprocesses started by the tests connect straight to the test database: under
# pytest-xdist, the one pytest-django suffixed with the xdist worker's id.
if os.environ.get("JOBQUEUE_TEST_SUBPROCESS"):
    _db["NAME"] = _db["TEST"]["NAME"]
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _db["NAME"] = f"{_db['NAME']}_{os.environ['PYTEST_XDIST_WORKER']}"
# The tests of Django's connection pool (test_worker_connection_release.py) give worker
# subprocesses a pooled default alias.
if os.environ.get("JOBQUEUE_TEST_DB_POOL"):
    _db.setdefault("OPTIONS", {})["pool"] = json.loads(os.environ["JOBQUEUE_TEST_DB_POOL"])
DATABASES = {"default": _db}
# The PgBouncer tests (tests/dialects/test_poolers.py) give worker subprocesses a second alias, the
# same test database through the pooler, and say which alias holds the queue and which the
# listener's LISTEN uses.
if os.environ.get("JOBQUEUE_TEST_POOLED_URL"):
    DATABASES["pooled"] = {
        **env.db_url_config(os.environ["JOBQUEUE_TEST_POOLED_URL"]),
        "DISABLE_SERVER_SIDE_CURSORS": True,  # a named cursor does not outlive a transaction
    }

# Tests make users by the dozen: a cheap hasher (never for production).
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",  # the live server of the browser tests serves admin CSS
    "django_jobqueue",
    "tests.testapp",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
STATIC_URL = "/static/"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
JOBQUEUE: dict[str, object] = {
    "RETRY_BACKOFF": float(os.environ.get("JOBQUEUE_TEST_BACKOFF", "0.05")),
    "RETRY_BACKOFF_MAX": 0.5,
    "LEASE_TTL": 30,
    "HEARTBEAT_INTERVAL": 5,
    "POLL_INTERVAL": 0.05,
    "RECLAIM_INTERVAL": 0.2,
}
# Concurrency limits for worker subprocesses, as JSON ({"openai": 4}), and a DYNAMIC_LIMIT hook:
# the tests of global limits pass them through the environment, the only channel into another
# process's settings.
for _name in ("GROUP_LIMITS", "QUEUE_LIMITS"):
    _raw = os.environ.get(f"JOBQUEUE_TEST_{_name}")
    if _raw:
        JOBQUEUE[_name] = json.loads(_raw)
for _name in ("SCHEDULES", "RATE_LIMITS", "MAINTENANCE", "LIMITS", "POOL_RETURN"):  # JSON
    _raw = os.environ.get(f"JOBQUEUE_TEST_{_name}")
    if _raw:
        JOBQUEUE[_name] = json.loads(_raw)
if os.environ.get("JOBQUEUE_TEST_CLOCK_FILE"):  # a simulated clock for the schedules
    JOBQUEUE["SCHEDULE_CLOCK"] = "tests.testapp.clock.now"
if os.environ.get("JOBQUEUE_TEST_DYNAMIC_LIMIT"):  # the dotted path of a DYNAMIC_LIMIT hook
    JOBQUEUE["DYNAMIC_LIMIT"] = os.environ["JOBQUEUE_TEST_DYNAMIC_LIMIT"]
TASKS = {
    "default": {
        "BACKEND": "django_jobqueue.backends.JobQueueBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"MAX_ATTEMPTS": 2},
    }
}
# TASKS for worker subprocesses, as JSON: the tests of several aliases on the backend, or of a
# subclass of it, pass theirs through the environment (the test process uses override_settings).
if os.environ.get("JOBQUEUE_TEST_TASKS"):
    TASKS = json.loads(os.environ["JOBQUEUE_TEST_TASKS"])
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {"django_jobqueue": {"handlers": ["stderr"], "level": "INFO"}},
}
for _name in ("DATABASE", "LISTEN_DATABASE"):  # aliases, for the PgBouncer tests
    if os.environ.get(f"JOBQUEUE_TEST_{_name}"):
        JOBQUEUE[_name] = os.environ[f"JOBQUEUE_TEST_{_name}"]
# JOBQUEUE["RETENTION"] for worker subprocesses, as JSON (tests of the pruner duty).
if os.environ.get("JOBQUEUE_TEST_RETENTION"):
    JOBQUEUE["RETENTION"] = json.loads(os.environ["JOBQUEUE_TEST_RETENTION"])
# JOBQUEUE["OPEN_CONTAINER_TIMEOUT"] for worker subprocesses, in seconds (tests of open containers).
if os.environ.get("JOBQUEUE_TEST_OPEN_CONTAINER_TIMEOUT"):
    JOBQUEUE["OPEN_CONTAINER_TIMEOUT"] = float(os.environ["JOBQUEUE_TEST_OPEN_CONTAINER_TIMEOUT"])
# Worker subprocesses of the telemetry tests: traces and metrics on, through an SDK that writes
# spans, metrics and log records to files of this directory (tests/support/otel_support.py).
if os.environ.get("JOBQUEUE_TEST_OTEL"):
    from tests.support.otel_support import to_files

    to_files(Path(os.environ["JOBQUEUE_TEST_OTEL"]))
    JOBQUEUE["OPENTELEMETRY"] = {"GAUGE_INTERVAL": 0.5}
