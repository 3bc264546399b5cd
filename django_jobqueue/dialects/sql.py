"""The SQL building blocks every other part of a dialect stands on.

Owns the connection of the dialect's alias, quoting, compiling ORM expressions and querysets to
SQL (so that raw statements reuse the ORM's portable parts), the database clock, the small SQL
fragments a vendor spells differently (IN lists, id sets, JSON appends, row-lock clauses), and
the helpers that read back what a raw cursor returns (`read_json`, `aware`, `result_of`), and
`seconds` (a delay as a timedelta, clamped to `MAX_DELAY`).

Invariant: nothing here runs a write, nor opens a transaction; the fragments are pure
functions of their arguments and the alias (their SQL is kept by callers in `_sql_cache`).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Expression, QuerySet
from django.db.models.sql import Query

from ..models import Job
from ..models.functions import DbNow

MAX_DELAY = 10 * 365 * 24 * 3600.0  # seconds: any longer delay is cut to ten years


def seconds(value: float) -> dt.timedelta:
    """Return `value` seconds as a timedelta, clamped to [0, ten years]."""
    return dt.timedelta(seconds=min(max(0.0, value), MAX_DELAY))


def result_of(cursor: Any) -> Any:
    """The rows of the statement `cursor` ran last, or the count of the rows it wrote."""
    return cursor.fetchall() if cursor.description is not None else cursor.rowcount


def read_json(value: Any) -> Any:
    """A JSON column's value as read by a raw cursor: text on some backends, parsed on others."""
    return json.loads(value) if isinstance(value, str) else value


def aware(value: Any) -> dt.datetime:
    """A datetime read by raw SQL, as an aware UTC datetime: SQLite gives text, MySQL and
    MariaDB naive datetimes (stored datetimes are UTC: USE_TZ, see E003)."""
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    moment: dt.datetime = value.astimezone(dt.UTC)
    return moment


class StatementCache(dict[Any, tuple[str, list[Any]]]):
    """A dialect's compiled statements by shape, emptied when it holds `limit` shapes.

    A worker sees few shapes, but some keys take values that change over its life (what is
    paused, the containers of a paused workflow): without a bound, a worker running for
    months would keep every one. Emptying it costs a compile per shape in use, once.
    """

    def __init__(self, limit: int = 512) -> None:
        super().__init__()
        self.limit = limit

    def __setitem__(self, key: Any, value: tuple[str, list[Any]]) -> None:
        if key not in self and len(self) >= self.limit:
            self.clear()
        super().__setitem__(key, value)


class SQL:
    """The connection, quoting, compiling, the clock and the SQL fragments of a dialect."""

    # Set by Dialect.__init__ (base.py).
    using: str
    _sql_cache: StatementCache

    @property
    def connection(self) -> BaseDatabaseWrapper:
        """The current thread's connection for this alias."""
        return connections[self.using]

    def qn(self, name: str) -> str:
        """Quote a table or column name."""
        return self.connection.ops.quote_name(name)

    def compile(self, expression: Any) -> tuple[str, list[Any]]:
        """Return the SQL and parameters of an ORM expression on this database."""
        query = Query(Job)
        compiler = query.get_compiler(using=self.using)
        sql, params = compiler.compile(expression.resolve_expression(query))
        return sql, list(params)

    def compile_query(self, queryset: QuerySet[Any]) -> tuple[str, list[Any]]:
        """Return the SQL and parameters of a SELECT queryset (inside a transaction)."""
        sql, params = queryset.query.get_compiler(using=self.using).as_sql()
        return sql, list(params)

    def now(self) -> dt.datetime:
        """Return the database server's current time (aware, UTC), read at this instant."""
        sql, params = self.clock_sql()
        with self.connection.cursor() as cursor:
            cursor.execute(f"SELECT {sql}", params)
            return aware(cursor.fetchone()[0])

    def clock_sql(self) -> tuple[str, list[Any]]:
        """The SQL of the server's clock at the moment a statement runs."""
        return self.compile(DbNow())

    def in_sql(self, column: str, values: Sequence[str]) -> tuple[str, list[Any]]:
        """SQL true for a row whose `column` is one of `values`: an IN list here."""
        return f"{column} IN ({', '.join(['%s'] * len(values))})", [*values]

    def id_set(self, ids: Sequence[int]) -> Any:
        """What `pk__in=` takes for many ids: here the list (an IN list of parameters).

        A dialect whose database can take the ids as one parameter (an array, a JSON
        document) returns a subquery instead: long lists cost Django and the database less.
        """
        return list(ids)

    def json_append(self, column: str, value: str) -> Expression:
        """An expression appending the string `value` to the JSON array in `column`."""
        raise NotImplementedError

    def json_append_sql(self, column: str) -> str:
        """Raw SQL appending a string parameter (%s) to the JSON array in `column`."""
        raise NotImplementedError

    # How a SELECT waits for and locks its rows (none on SQLite: its writers take turns).
    blocking_lock_sql = " FOR UPDATE"

    # How a SELECT locks the rows it can lock at once, passing over those another transaction
    # holds (none on SQLite, as above).
    skip_locked_sql = " FOR UPDATE SKIP LOCKED"
