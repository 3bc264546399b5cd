"""The records of durable calls (durable.py): written only while the job's lease holds.

Owns reading a batch of jobs' records (`read_records`, compiled once per number of ids), the
fenced INSERT of one record (`record_call`, `record_call_sql`) or of any row beside it
(`fenced_insert_sql`), several jobs' records at once (`record_calls`), and the transaction a
record written alone commits in.

Invariant: a record is written only while the lease (owner, attempt) is current, and its
write locks the job's row until the transaction ends: a reclaim cannot pass it.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from typing import Any

from django.db.models import Model
from django.utils import timezone

from ..models import Job, JobStep
from .inserts import Inserts


@functools.cache
def _fields(model: type[Model]) -> dict[str, Any]:
    """A model's concrete fields by name (looked up for every record and fenced row)."""
    return {f.name: f for f in model._meta.concrete_fields}


class Steps(Inserts):
    """The fenced records of durable calls."""

    def read_records(self, ids: list[int], limit: int) -> list[tuple[Any, ...]]:
        """The first `limit` records of the jobs `ids` (ascending), in job order: (job id,
        name, seq, result as the database returns it: see `read_json`, place).

        Its statement is compiled by the ORM once per number of ids and kept: a claim reads the
        records of each batch of resumed jobs, and compiling it each time cost more than its run.
        """
        key = ("read_records", len(ids), limit)
        if key not in self._sql_cache:
            query = (
                JobStep.objects.using(self.using)
                .filter(job_id__in=ids)
                .order_by("job_id")
                .values_list("job_id", "name", "seq", "result", "place")[:limit]
            )
            sql, params = self.compile_query(query)
            assert params == ids, "the ids must be the statement's only parameters"
            self._sql_cache[key] = (sql, [])
        sql, _ = self._sql_cache[key]
        return self._fetch_records(sql, ids)

    def _fetch_records(self, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return list(cursor.fetchall())

    def record_call(
        self,
        *,
        job_id: int,
        owner: str,
        attempt: int,
        name: str,
        seq: int,
        result: Any,
        duration: float | None,
        place: int | None = None,
        mark: bool = False,
    ) -> bool:
        """Insert the record of a durable call while the lease (owner, attempt) is current,
        locking the job's row until the caller's transaction ends; False (nothing written)
        when the lease is gone. With `mark` (the job's first record), say so on its row
        (`has_steps`, which the claim reads).

        One statement, the fence and the insert together (INSERT ... SELECT ... FOR UPDATE):
        a step's record was a locking read, then an INSERT, each built by the ORM, which
        made a step cost twice an `enqueue()`. The mark is a second one, in the caller's
        transaction.
        """
        sql, params = self.record_call_sql(job_id=job_id, owner=owner, attempt=attempt, name=name,
                                           seq=seq, result=result, duration=duration,
                                           place=place)  # fmt: skip
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            recorded = bool(cursor.rowcount)
        if recorded and mark:
            Job.objects.using(self.using).filter(pk=job_id).update(has_steps=True)
        return recorded

    def record_call_sql(
        self, *, job_id: int, owner: str, attempt: int, name: str, seq: int, result: Any,
        duration: float | None, place: int | None = None,
    ) -> tuple[str, list[Any]]:  # fmt: skip
        """`record_call`'s statement (without the mark), to run with others (`write_together`):
        it inserts one row while the lease is current, and locks the job's row."""
        values = self._record_values(name, seq, place, result, attempt, duration)
        return self._record_call_sql, [*values, job_id, owner, attempt]

    def _record_values(
        self,
        name: str,
        seq: int,
        place: int | None,
        result: Any,
        attempt: int,
        duration: float | None,
    ) -> list[Any]:
        """The values of a JobStep row's columns, in `_record_call_sql`'s order."""
        fields, connection = _fields(JobStep), self.connection
        return [
            fields["name"].get_db_prep_save(name, connection),
            seq,
            place,
            fields["result"].get_db_prep_save(result, connection),
            attempt,
            duration,
            fields["created_at"].get_db_prep_save(timezone.now(), connection),
        ]

    @functools.cached_property
    def _record_call_sql(self) -> str:
        step, job = self.qn(JobStep._meta.db_table), self.qn(Job._meta.db_table)
        states = ", ".join(f"'{state}'" for state in Job.LEASED_STATES)
        return (
            f"INSERT INTO {step} (job_id, name, seq, place, result, attempt, duration, "
            f"created_at) SELECT j.id, %s, %s, %s, %s, %s, %s, %s FROM {job} j WHERE j.id = %s "
            f"AND j.lease_owner = %s AND j.attempts = %s AND j.state IN ({states})"
            f"{self.blocking_lock_sql}"
        )

    def fenced_insert_sql(
        self,
        model: type[Model],
        row: dict[str, Any],
        lease: tuple[int, str, int],
        *,
        add_to: tuple[Sequence[str], str] | None = None,
    ) -> tuple[str, list[Any]]:
        """An INSERT of one row of `model` ({field: value}) that writes it only while `lease`
        (job id, owner, attempt) is current; with `add_to` ((key fields, value field)), one
        that adds its value to the row of the same keys, made if missing (as
        `add_to_minutes`). It goes after `record_call_sql` in a `write_together`, which locked
        the job's row: then the row is written with the record, or neither."""
        fields = _fields(model)
        connection = self.connection
        params = [fields[name].get_db_prep_save(v, connection) for name, v in row.items()]
        # The text depends only on the shape: built once (a running job sends one a call).
        key = ("fenced_insert", model, tuple(row), add_to)
        if key not in self._sql_cache:
            names = ", ".join(self.qn(fields[name].column) for name in row)
            marks = ", ".join(["%s"] * len(row))
            job = self.qn(Job._meta.db_table)
            states = ", ".join(f"'{state}'" for state in Job.LEASED_STATES)
            sql = (
                f"INSERT INTO {self.qn(model._meta.db_table)} ({names}) SELECT {marks} "
                f"FROM {job} j WHERE j.id = %s AND j.lease_owner = %s AND j.attempts = %s "
                f"AND j.state IN ({states})"
            )
            if add_to is not None:
                sql += " " + self._add_on_conflict(self.qn(model._meta.db_table), *add_to)
            self._sql_cache[key] = (sql, [])
        return self._sql_cache[key][0], [*params, *lease]

    def record_calls(self, items: Sequence[tuple[Any, ...]]) -> set[int]:
        """Insert the records of several jobs' durable calls (one a job), as `record_call`
        would each, in the caller's transaction; return the ids of the jobs recorded.

        Each item is (job id, lease owner, attempt, name, seq, place, result, duration, mark).
        """
        recorded = set()
        by_job = sorted(items, key=operator.itemgetter(0))  # rows locked in id order
        for job_id, owner, attempt, name, seq, place, result, duration, mark in by_job:
            if self.record_call(job_id=job_id, owner=owner, attempt=attempt, name=name, seq=seq,
                                place=place, result=result, duration=duration,
                                mark=mark):  # fmt: skip
                recorded.add(job_id)
        return recorded

    def record_transaction(self) -> Any:
        """The transaction that a record written alone (`record_call`, with no other write)
        commits in: by default step_transaction()'s."""
        return self.step_transaction()
