"""The resources of every limit (limits/resources.py): their rows, locked at claim and grant.

Owns locking the `Limit` rows a claim needs without waiting (`lock_resources`), with the
`uses` of the jobs in flight read after the lock, a running job's grant (`grant_sql`, one
statement where the database allows), and which resources have a row. Raw statements: a claim
under LIMITS runs both, and the ORM took four times as long as the database to build them.

Invariant: rows are locked in name order; the jobs in flight are read by a statement of their
own, after the lock, so that at READ COMMITTED it sees what earlier holders committed.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, NamedTuple

from ..models import Job, Limit
from .sql import aware, read_json
from .transactions import Transactions


class LockedResources(NamedTuple):
    """The `Limit` rows a claim locked: each one's (name, closed_until), the database's time at
    the lock, and the `uses` of the jobs in flight that use them (read after the lock)."""

    rows: list[tuple[str, dt.datetime | None]]
    now: dt.datetime
    uses: list[dict[str, int]]


class GrantWrite(NamedTuple):
    """What `Dialect.grant_sql` grants and writes: `units` of `resource` under `cap` (the
    window's statement `read`), the record (name, seq, place) fenced by `lease` (job id, owner,
    attempt), and the spend of `handler`."""

    resource: str
    units: int
    cap: int
    read: tuple[str, list[Any]]
    record: tuple[str, int, int | None]
    lease: tuple[int, str, int]
    handler: str


class Resources(Transactions):
    """The locks and reads of limits' resource rows, and a running job's grant."""

    def lock_resources(self, names: Sequence[str], capped: Sequence[str] = ()) -> LockedResources:
        """Lock the existing `Limit` rows of `names` that no other transaction holds, without
        waiting; then read the `uses` of the jobs in flight that use any resource of `capped`.

        Return each row locked (name, closed_until), the database's time at the lock, and
        those `uses`: a name missing from the rows has no row yet, or another transaction
        holds it. The jobs in flight are read by a statement of its own, after the lock: at
        READ COMMITTED it sees what the claims that held those rows before committed.
        """
        statements = [self.lock_resources_sql(names)]
        if capped:
            statements.append(self.uses_in_flight_sql(capped))
        results = self.execute_together(statements)
        rows, uses = results[0], results[1] if capped else []
        now = aware(rows[0][2]) if rows else self.now()
        locked = [(name, aware(until) if until else None) for name, until, _ in rows]
        return LockedResources(locked, now, [read_json(u) for (u,) in uses])

    def lock_resources_sql(
        self, names: Sequence[str], *, wait: bool = False
    ) -> tuple[str, list[Any]]:
        """The statement of `lock_resources` that locks the rows (and reads the clock); with
        `wait`, one that waits for their holders (a running job's grant of one resource)."""
        clock, params = self.clock_sql()
        named, names_params = self.in_sql("name", names)
        lock = self.blocking_lock_sql if wait else self.skip_locked_sql
        sql = (
            f"SELECT name, closed_until, {clock} FROM {self.qn(Limit._meta.db_table)} "
            f"WHERE {named} ORDER BY name{lock}"
        )
        return sql, [*params, *names_params]

    def grant_sql(self, grant: GrantWrite) -> tuple[str, list[Any]]:
        """The one statement of a running job's grant, after the lock of its resource's row
        (`can_grant_in_one_statement`): read the clock and the window (`grant.read`); if the
        row is there and the window has room for `grant.units` under `grant.cap`, write the
        grant's record (`grant.record`: name, seq, place; fenced by `grant.lease`, locking the
        job's row) and its window and spend rows, stamped with that clock. Its one row:
        (clock, closed_until, units in the window, their oldest start, records written)."""
        raise NotImplementedError

    def existing_resources(self, names: Sequence[str]) -> set[str]:
        """The names of `names` that have a `Limit` row, read without a lock (nor a wait)."""
        named, params = self.in_sql("name", names)
        with self.cursor() as cursor:
            cursor.execute(
                f"SELECT name FROM {self.qn(Limit._meta.db_table)} WHERE {named}", params
            )
            return {name for (name,) in cursor.fetchall()}

    def uses_in_flight_sql(self, names: Sequence[str]) -> tuple[str, list[Any]]:
        """The `uses` of the leased and running jobs that use any resource of `names`."""
        sql, params = self.uses_any_sql(names)
        table = self.qn(Job._meta.db_table)
        return f"SELECT uses FROM {table} WHERE lease_expires IS NOT NULL AND {sql}", params

    def uses_any_sql(self, names: Sequence[str]) -> tuple[str, list[Any]]:
        """SQL true for a job whose `uses` names one of `names`."""
        marks = ", ".join(["%s"] * len(names))
        return f"EXISTS (SELECT 1 FROM json_each(uses) AS e WHERE e.key IN ({marks}))", [*names]
