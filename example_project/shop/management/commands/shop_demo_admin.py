"""manage.py shop_demo_admin: an admin login (admin / admin) for the demo's SQLite database.

`make demo-site` runs it before `runserver 127.0.0.1:8000` (`make demo-site PORT=8001`: with
`--port 8001`, for the links it prints). It refuses any database but SQLite, and settings with
DEBUG off: a well-known password belongs to a local demo only.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from django_jobqueue.models import Job

USERNAME = PASSWORD = "admin"
PORT = 8000  # of the example site, for the links it prints


class Command(BaseCommand):
    help = "Create or update the superuser admin / admin, on the demo's SQLite database only."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--port", type=int, default=PORT, help="The site's port.")

    def handle(self, *args: Any, **options: Any) -> None:
        if connection.vendor != "sqlite" or not settings.DEBUG:
            raise CommandError(
                "shop_demo_admin sets a well-known password: it runs only with DEBUG on and "
                f"an SQLite database (this is {connection.vendor}, DEBUG={settings.DEBUG})."
            )
        user, created = get_user_model().objects.get_or_create(username=USERNAME)
        user.is_staff = user.is_superuser = user.is_active = True
        user.set_password(PASSWORD)
        user.save()
        name = connection.settings_dict["NAME"]
        self.stdout.write(
            f"{'Created' if created else 'Updated'} the superuser {USERNAME!r} "
            f"(password {PASSWORD!r}) in {name}."
        )
        site = f"http://127.0.0.1:{options['port']}"
        if not Job.objects.exists():
            self.stdout.write("The queue is empty: `make demo` fills it.")
        self.stdout.write(
            f"Open {site}/admin/ and log in as {USERNAME} / {PASSWORD}; the demo's jobs are at "
            f"{site}/admin/django_jobqueue/job/. Ctrl-C stops the server."
        )
        acme = Job.objects.filter(is_container=True, type="catalogue-acme").first()
        if acme is not None:
            self.stdout.write(
                f"The story ends on the overview, with the run's charts: "
                f"{site}/admin/django_jobqueue/queueoverview/ and on acme's workflow, with its "
                f"timeline: {site}/admin/django_jobqueue/job/{acme.pk}/change/"
            )
