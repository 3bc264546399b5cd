"""A cheaper flush after each `transaction=True` test, with the same end state.

Django empties every table after such a test, then sends `post_migrate`, whose receivers
(contenttypes and auth) write back the content types and permissions the flush deleted:
about 20 ms of queries, after each of the suite's thousand transactional tests, on each
database. On PostgreSQL the flush itself is one TRUNCATE of every table, about 140 ms on this
machine, most of it the new files TRUNCATE makes for each table and index, empty or not.

Here the flush:
- keeps the content types and permissions (what `post_migrate` would write back, the same
  rows) and sends no `post_migrate`, unless a test changed them (their count or highest id
  moved): then it empties every table and sends `post_migrate`, as Django's flush does;
- on PostgreSQL truncates only the tables that have a row (one query asks which), with
  CASCADE for the empty tables that reference one of them (TRUNCATE refuses without them).

Every other table ends empty, sequences as they were: what Django's flush leaves. Only the
test process's flush changes; worker subprocesses never flush.
"""

from __future__ import annotations

from typing import Any

from django.core.management.commands import flush
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.base.operations import BaseDatabaseOperations

# Written by post_migrate alone; auth_permission refers to django_content_type.
KEPT = ("auth_permission", "django_content_type")

_sql_flush = flush.sql_flush
_emit_post_migrate_signal = flush.emit_post_migrate_signal
_backend_sql_flush: list[Any] = []  # PostgreSQL's own sql_flush, once replaced
# Per database alias: what the kept tables held after post_migrate last wrote them.
_kept_state: dict[str, tuple[Any, ...]] = {}


def _state(connection: BaseDatabaseWrapper) -> tuple[Any, ...]:
    quote = connection.ops.quote_name
    probe = ", ".join(
        f"(SELECT COUNT(*) FROM {quote(t)}), (SELECT MAX(id) FROM {quote(t)})" for t in KEPT
    )
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {probe}")
        return tuple(cursor.fetchone())


def _flush_sql(
    style: Any,
    connection: BaseDatabaseWrapper,
    reset_sequences: bool = True,
    allow_cascade: bool = False,
) -> list[str]:
    """Django's flush statements, for every table but the kept ones while they hold what
    post_migrate wrote last (else for every table, and post_migrate writes them again)."""
    alias = connection.alias
    if (
        alias != DEFAULT_DB_ALIAS  # the extra aliases some tests add: not always migrated
        or reset_sequences
        or _kept_state.get(alias) != _state(connection)
    ):
        _kept_state.pop(alias, None)
        return _sql_flush(style, connection, reset_sequences, allow_cascade)
    tables = [
        table
        for table in connection.introspection.django_table_names(
            only_existing=True, include_views=False
        )
        if table not in KEPT
    ]
    return connection.ops.sql_flush(
        style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
    )


def _post_migrate(verbosity: int, interactive: bool, db: str, **kwargs: Any) -> None:
    """Send post_migrate unless the flush kept what it would write."""
    if db == DEFAULT_DB_ALIAS and db in _kept_state:
        return
    _emit_post_migrate_signal(verbosity, interactive, db, **kwargs)
    if db == DEFAULT_DB_ALIAS:
        _kept_state[db] = _state(connections[db])


def _only_written(
    self: BaseDatabaseOperations,
    style: Any,
    tables: list[str],
    *,
    reset_sequences: bool = False,
    allow_cascade: bool = False,
) -> list[str]:
    # A reset of the sequences must reach every table, written to or not.
    if tables and not reset_sequences:
        quote = self.quote_name
        probe = " UNION ALL ".join(
            f"SELECT %s WHERE EXISTS (SELECT 1 FROM {quote(table)})" for table in tables
        )
        with self.connection.cursor() as cursor:
            cursor.execute(probe, list(tables))
            written = {row[0] for row in cursor.fetchall()}
        tables = [table for table in tables if table in written]
        allow_cascade = True
    return _backend_sql_flush[0](
        self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
    )


def install() -> None:
    """Make the test process's flush the one described above."""
    flush.sql_flush = _flush_sql  # type: ignore[assignment]
    flush.emit_post_migrate_signal = _post_migrate  # type: ignore[assignment]
    if connection.vendor == "postgresql":
        from django.db.backends.postgresql.operations import DatabaseOperations

        _backend_sql_flush.append(DatabaseOperations.sql_flush)
        DatabaseOperations.sql_flush = _only_written  # type: ignore[method-assign]
