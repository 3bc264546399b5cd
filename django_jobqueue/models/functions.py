"""Database expressions whose SQL differs per database."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.db import NotSupportedError
from django.db.models import DateTimeField, Func, IntegerField, Value
from django.db.models.functions import Now


class DbNow(Now):
    """The database server's current time, comparable with stored datetimes on every database."""

    def as_mysql(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        # MySQL's CURRENT_TIMESTAMP is in the session time zone, but Django stores datetimes
        # as naive UTC when USE_TZ is on: compare against UTC_TIMESTAMP instead.
        template = "UTC_TIMESTAMP(6)" if settings.USE_TZ else "CURRENT_TIMESTAMP(6)"
        return self.as_sql(compiler, connection, template=template, **extra_context)


class MinuteSlot(Func):
    """Which slot of `step` minutes from `first` a datetime column falls in: an integer.

    The admin's charts group their per-minute rows in the database with it, so that a day
    of figures comes back as a few hundred integers rather than thousands of datetimes to
    convert. Rows before `first` are filtered out by the caller (the division truncates).
    Datetimes are stored in UTC (USE_TZ, and no per-database TIME_ZONE), as everywhere here.
    """

    output_field = IntegerField()

    def __init__(self, column: str, first: dt.datetime, step: int) -> None:
        super().__init__(column, Value(first, output_field=DateTimeField()))
        self.step = int(step)

    def as_sql(self, compiler: Any, connection: Any, *args: Any, **extra_context: Any) -> Any:
        raise NotSupportedError(f"MinuteSlot has no SQL for {connection.vendor}.")

    def _parts(self, compiler: Any) -> tuple[str, str, list[Any], list[Any]]:
        (column, column_params), (first, first_params) = (
            compiler.compile(expression) for expression in self.get_source_expressions()
        )
        return column, first, list(column_params), list(first_params)

    def as_postgresql(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        column, first, column_params, first_params = self._parts(compiler)
        seconds = f"EXTRACT(EPOCH FROM ({column} - {first}))"
        return f"CAST(FLOOR({seconds} / {60 * self.step}) AS INTEGER)", column_params + first_params

    def as_mysql(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        column, first, column_params, first_params = self._parts(compiler)
        sql = f"(TIMESTAMPDIFF(MINUTE, {first}, {column}) DIV {self.step})"
        return sql, first_params + column_params

    def as_sqlite(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        column, first, column_params, first_params = self._parts(compiler)
        # '%%s' reaches SQLite as '%s' (seconds since the epoch) once Django formats the query.
        seconds = f"(strftime('%%s', {column}) - strftime('%%s', {first}))"
        return f"({seconds} / {60 * self.step})", column_params + first_params
