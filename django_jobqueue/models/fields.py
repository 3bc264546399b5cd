"""Key columns that compare exactly on every database, and the migration operation for them."""

from __future__ import annotations

from typing import Any

from django.db import migrations, models
from django.db.models.lookups import In

from .literals import array


def key_collation(connection: Any) -> str | None:
    """The collation under which key columns compare exactly on `connection`'s database, or
    None where its default comparison is exact already (PostgreSQL's and SQLite's compare byte
    for byte)."""
    if connection.vendor != "mysql":
        return None
    # The server's default *_ci collations ignore case and accents, and utf8mb4_bin pads
    # trailing spaces ('a' = 'a '): the binary no-pad collations compare exactly.
    connection.ensure_connection()
    if connection.mysql_is_mariadb:
        return "utf8mb4_nopad_bin"
    # MySQL has utf8mb4_0900_bin (NO PAD) from 8.0.17; before, utf8mb4_bin is the closest.
    return "utf8mb4_0900_bin" if connection.mysql_version >= (8, 0, 17) else "utf8mb4_bin"


class KeyField(models.CharField):  # type: ignore[type-arg]
    """A name or key (handler type, queue, group, unique key, worker id) compared exactly.

    Exactly means as Python compares strings: case, accents and trailing spaces count. The
    column gets the dialect's key collation (a binary one on MySQL/MariaDB, whose default
    `*_ci` collations ignore all three) and the database's default where that is exact
    already. A `db_collation` given explicitly wins.
    """

    def db_parameters(self, connection: Any) -> dict[str, Any]:
        params = super().db_parameters(connection)
        if self.db_collation is None:
            params["collation"] = key_collation(connection)
        return params


@KeyField.register_lookup
class AnyOf(In):
    """`key__any_of=values`: the keys in `values`, as `__in` gives them.

    On PostgreSQL the values are one array parameter (`= ANY(%s::varchar[])`), not one parameter
    each: the statement's text is the same however many values there are, and psycopg parses
    a statement of more than 50 parameters afresh at every run (the claim filters on every
    handler type the worker has, and runs many times a second). The array goes as its text
    (`literals.array`), which the drivers bind faster than a list.
    """

    lookup_name = "any_of"

    def as_postgresql(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
        lhs, lhs_params = self.process_lhs(compiler, connection)
        values = [value for value in self.rhs if value is not None]
        return f"{lhs} = ANY(%s::varchar[])", [*lhs_params, array(values)]


class AlterKeyField(migrations.AlterField):
    """AlterField to a KeyField, touching the table only where the key collation differs.

    Without this, SQLite would rebuild each table to change nothing in its schema.
    """

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if key_collation(schema_editor.connection) is not None:
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if key_collation(schema_editor.connection) is not None:
            super().database_backwards(app_label, schema_editor, from_state, to_state)

    def describe(self) -> str:
        return f"Compare {self.model_name}.{self.name} exactly (a binary collation on MySQL)"
