"""Database expressions whose SQL differs per database."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.models.functions import Now


class DbNow(Now):
    """The database server's current time, comparable with stored datetimes on every database."""

    def as_mysql(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        # MySQL's CURRENT_TIMESTAMP is in the session time zone, but Django stores datetimes
        # as naive UTC when USE_TZ is on: compare against UTC_TIMESTAMP instead.
        template = "UTC_TIMESTAMP(6)" if settings.USE_TZ else "CURRENT_TIMESTAMP(6)"
        return self.as_sql(compiler, connection, template=template, **extra_context)
