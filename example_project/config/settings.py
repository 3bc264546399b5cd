"""Settings of the example project: a shop whose order workflow runs on django_jobqueue.

Everything that differs between machines comes from the environment:

- ``DATABASE_URL``: where the app *and* the queue live (default: ``db.sqlite3`` next to
  ``manage.py``), e.g. ``postgres://postgres@127.0.0.1:5432/jobqueue_demo``.
- ``SECRET_KEY`` and ``DEBUG``: the defaults suit local use only.
"""

from __future__ import annotations

from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

SECRET_KEY = env.str("SECRET_KEY", default="example-project-insecure-not-for-production")
DEBUG = env.bool("DEBUG", default=True)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_jobqueue",
    "shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# The queue's tables live in this database too, so enqueue() commits with your own writes.
DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}")}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # WAL lets workers and the app read while one writes; IMMEDIATE takes the write lock at
    # BEGIN, so a transaction that reads and then enqueues never hits "database is locked".
    # (django_jobqueue's system checks W001/W002 warn when either is missing.)
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"init_command": "PRAGMA journal_mode=WAL;", "transaction_mode": "IMMEDIATE"}
    )
elif DATABASES["default"]["ENGINE"].endswith("mysql"):
    DATABASES["default"].setdefault("OPTIONS", {}).update({"charset": "utf8mb4"})

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True  # the queue compares deadlines with the database clock, in UTC

STATIC_URL = "static/"

# django_jobqueue settings; every key is optional (see django_jobqueue/conf.py for all of them).
JOBQUEUE = {
    # Seconds an idle worker waits between polls for ready jobs (default 1.0). Short here so
    # the demo's follow-up job (send_receipt) starts right after its upstream jobs finish.
    "POLL_INTERVAL": 0.2,
    # Attempts a job gets before it is marked dead, unless enqueue() says otherwise (default 3).
    "MAX_ATTEMPTS": 3,
    # Base of the exponential backoff between attempts, in seconds (default 2.0). Short here so
    # the demo's failing job is retried half a second later.
    "RETRY_BACKOFF": 0.5,
    # Seconds one attempt may run before it is failed (default None: no limit).
    "TIMEOUT": 30,
    # Resources that jobs share across all workers: here each tenant's daily token budget,
    # which shop.summarize_reviews takes from call by call (ctx.acquire) and settles by what
    # the model used (ctx.settle).
    # And a concurrency cap per tenant, for the jobs that say `uses={"tenant:<name>": 1}` (none
    # of the story's do: it shows on the admin's Limits page beside the budget).
    "LIMITS": {"llm-tokens:*": {"rate": "200000/d"}, "tenant:*": {"concurrency": 2}},
    # Jobs the workers enqueue on a schedule: the exchange rates every night at 03:00 UTC (see
    # the admin's Schedules page for its next run).
    "SCHEDULES": {
        "nightly-rates": {
            "handler": "shop.fetch_rates",
            "cron": "0 3 * * *",
            "args": {"currency": "EUR"},
        },
    },
}

# Django's Tasks framework (django.tasks), backed by the same queue: a @task's .enqueue() writes a
# job in the caller's transaction, and jobqueue_worker runs it (see shop/tasks.py).
TASKS = {
    "default": {
        "BACKEND": "django_jobqueue.backends.JobQueueBackend",
        "QUEUES": ["default"],
        # Defaults of the tasks' jobs: attempts (as JOBQUEUE's MAX_ATTEMPTS) and timeout.
        "OPTIONS": {"MAX_ATTEMPTS": 3, "TIMEOUT": 30},
    }
}

# Show the worker's INFO and WARNING lines (start-up, failures, retries) on stderr.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "short": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
    },
    "handlers": {
        "stderr": {"class": "logging.StreamHandler", "formatter": "short"},
    },
    "loggers": {
        "django_jobqueue": {"handlers": ["stderr"], "level": "INFO", "propagate": False},
    },
}
