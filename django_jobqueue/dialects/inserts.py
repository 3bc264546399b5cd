"""Inserts: new jobs in bulk, and upserts that add to a counter row.

Owns `insert_jobs` (one statement where the database returns the new ids, else one INSERT a
job), the JSON document that carries a bulk enqueue's varying columns (`JobDocument`,
`_insert_document`, `_insert_selected`: a dialect may insert from it with one parameter), and
the upserts of figures (`add_to_minutes`, `conflict_target`).

Invariant: every inserted job gets its primary key and creation time back, as `save()`
would set them; columns left to the database clock are never sent.
"""

from __future__ import annotations

import dataclasses
import json
import operator
from collections.abc import Sequence
from typing import Any

from django.db.models import DateTimeField, Expression, JSONField

from ..models import Job
from ..models.functions import DbNow
from .transactions import Transactions


@dataclasses.dataclass
class JobDocument:
    """New jobs' columns for one INSERT: the values all rows share, and the rest as JSON."""

    fields: list[Any]  # the columns written, in order (all but id, created_at, updated_at)
    constants: dict[int, Any]  # field index -> the value every row has (JSON as JSON text)
    varying: list[int]  # field indexes whose values the document holds, in this order
    document: str  # a JSON list of rows, each the values of `varying`
    count: int


# What a new job's JSON columns may hold to travel inside `_insert_document`'s document.
_JSON_DOCUMENT_TYPES = {dict, list, type(None)}


class Inserts(Transactions):
    """Bulk inserts of new jobs and counter upserts."""

    def insert_jobs(self, jobs: list[Job]) -> None:
        """Insert unsaved `jobs` and set their primary keys (one statement where possible)."""
        if not self.connection.features.can_return_rows_from_bulk_insert:
            # MySQL (and SQLite before 3.35) return no ids from a multi-row INSERT, and
            # bulk_create() then sets no primary keys: one INSERT per job.
            for job in jobs:
                job.save(using=self.using, force_insert=True)
            return
        Job.objects.using(self.using).bulk_create(jobs, batch_size=500)

    def _insert_selected(
        self,
        jobs: list[Job],
        found: JobDocument,
        values: list[str],
        params: list[Any],
        source: str,
        *,
        sort_by_id: bool = False,
    ) -> None:
        """Insert `jobs` as `SELECT <values> FROM <source>` over their document (`found`,
        from _insert_document): `values` gives each field's SQL, `params` the parameters of
        the constant ones, and `source` reads the document, the statement's last parameter,
        in the jobs' order. The jobs take the ids and creation times the rows return (in
        their order, or sorted by id where the database returns them unordered)."""
        now, _ = self.compile(DbNow())
        columns = [self.qn(str(f.column)) for f in found.fields]
        sql = (
            f"INSERT INTO {self.qn(Job._meta.db_table)} "
            f"({', '.join(columns)}, created_at, updated_at) "
            f"SELECT {', '.join(values)}, {now}, {now} FROM {source} "
            "RETURNING id, created_at"
        )
        conn = self.connection
        created_at = Job._meta.get_field("created_at")
        converters = conn.ops.get_db_converters(created_at.get_col(Job._meta.db_table))
        with self.cursor() as cursor:
            cursor.execute(sql, [*params, found.document])
            rows = cursor.fetchall()
        for job, (pk, created) in zip(jobs, sorted(rows) if sort_by_id else rows, strict=True):
            for convert in converters:
                created = convert(created, created_at, conn)
            job.id = pk  # the attribute, not the `pk` property: thousands of jobs
            job.created_at = job.updated_at = created
            job._state.adding = False
            job._state.db = self.using

    def _insert_document(self, jobs: list[Job]) -> JobDocument | None:
        """The jobs' columns as one JSON document (a list of rows), or None if it cannot be.

        JSON columns travel as JSON inside it (objects, arrays or null: what a new job's
        JSON columns hold), datetimes as the text this database stores; `created_at` and
        `updated_at` are left to the database clock. Anything else takes the generic path.
        A column that holds the same value in every job travels once, as a parameter: most
        columns of a bulk enqueue do, and the database then parses a fraction of the JSON.
        """
        fields = [
            f
            for f in Job._meta.concrete_fields
            if not f.primary_key and f.attname not in ("created_at", "updated_at")
        ]
        read = operator.attrgetter(*(f.attname for f in fields))
        dates = [n for n, f in enumerate(fields) if isinstance(f, DateTimeField)]
        documents = [n for n, f in enumerate(fields) if isinstance(f, JSONField)]
        ops = self.connection.ops
        rows = [list(read(job)) for job in jobs]
        if not rows:
            return None
        # Column by column, the checks in C where they can be (a bulk enqueue of plain jobs
        # spent most of its Python time here, row by row).
        columns = list(zip(*rows, strict=True))
        for n in documents:
            if not set(map(type, columns[n])) <= _JSON_DOCUMENT_TYPES:
                return None
        for n in dates:
            if columns[n].count(None) == len(rows):
                continue
            for row in rows:
                if row[n] is not None:
                    if isinstance(row[n], Expression):
                        return None  # a value the database computes
                    row[n] = str(ops.adapt_datetimefield_value(row[n]))
            columns[n] = tuple(row[n] for row in rows)
        first = rows[0]
        # Equal values of one type (1 == True): the column travels once, as a parameter.
        same = [
            n
            for n, column in enumerate(columns)
            if column.count(first[n]) == len(column) and len(set(map(type, column))) == 1
        ]
        varying = [n for n in range(len(fields)) if n not in set(same)]
        try:
            constants = {
                n: json.dumps(first[n], allow_nan=False)
                if n in documents and first[n] is not None
                else first[n]
                for n in same
            }
            document = json.dumps([[row[n] for n in varying] for row in rows], allow_nan=False)
        except (TypeError, ValueError):
            return None  # an expression or an odd value somewhere: the generic path
        return JobDocument(fields, constants, varying, document, len(rows))

    def conflict_target(self, fields: Sequence[str]) -> list[str] | None:
        """`unique_fields` for an upsert (`bulk_create(update_conflicts=True)`) on the unique
        `fields`: them, or None where the database's upsert names no conflict target (MySQL's
        ON DUPLICATE KEY UPDATE, which any unique key triggers)."""
        return (
            list(fields) if self.connection.features.supports_update_conflicts_with_target else None
        )

    def add_to_minutes(
        self,
        model: type[Any],
        keys: Sequence[str],
        value: str,
        rows: Sequence[tuple[Sequence[Any], int]],
    ) -> None:
        """Add each row's number to column `value` of the row of `model` with its `keys`
        values, made if missing: one upsert (INSERT ... ON CONFLICT DO UPDATE) for all."""
        if not rows:
            return
        table = self.qn(model._meta.db_table)
        fields = {f.name: f for f in model._meta.concrete_fields}
        columns = [*keys, value]
        marks = ", ".join(["(" + ", ".join(["%s"] * len(columns)) + ")"] * len(rows))
        params = [
            fields[name].get_db_prep_save(v, self.connection)
            for key, n in rows
            for name, v in zip(columns, [*key, n], strict=True)
        ]
        names = ", ".join(self.qn(c) for c in columns)
        sql = f"INSERT INTO {table} ({names}) VALUES {marks} " + self._add_on_conflict(
            table, keys, value
        )
        with self.cursor() as cursor:
            cursor.execute(sql, params)

    def _add_on_conflict(self, table: str, keys: Sequence[str], value: str) -> str:
        """The clause of `add_to_minutes` that adds to the row already there."""
        column = self.qn(value)
        target = ", ".join(self.qn(k) for k in keys)
        return (
            f"ON CONFLICT ({target}) DO UPDATE SET {column} = {table}.{column} + EXCLUDED.{column}"
        )
