"""Settings of the admin scale benchmark: the bench project plus the Django admin.

Its own database (BENCH_ADMIN_DB_NAME, default `jobqueue_bench_admin`; an SQLite file beside
the bench's), so that filling a million rows never touches another benchmark's tables.
"""

import os

from .settings import *  # noqa: F403
from .settings import DATABASES, INSTALLED_APPS, STATE

NAME = os.environ.get("BENCH_ADMIN_DB_NAME", "jobqueue_bench_admin")
DATABASES["default"]["NAME"] = (
    str(STATE / f"{NAME}.sqlite3") if DATABASES["default"]["ENGINE"].endswith("sqlite3") else NAME
)
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",  # runserver --insecure serves the admin's files (admin_browser)
    *INSTALLED_APPS,
]
STATIC_URL = "static/"
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "bench.project.admin_urls"
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
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
ALLOWED_HOSTS = ["testserver", "127.0.0.1"]
