"""The rows of job sequences (sequences.py): locked, made if missing, by one upsert.

Invariant: the rows are locked in key order until the transaction ends, each by an update of
itself (never a lock taken to read then upgraded), so no two writers deadlock on them.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.utils import timezone

from ..models import JobSequence
from .transactions import Transactions


class Sequences(Transactions):
    """The locked rows of job sequences."""

    # Set by Dialect (base.py) and its vendors.
    can_return_rows_from_update: bool

    def lock_sequences(self, keys: Sequence[str]) -> dict[str, int | None]:
        """Lock the rows of sequences `keys` (sorted) until the transaction ends, making the
        missing ones; return {key: head}.

        One upsert: an existing row is locked by its no-op update (its waiters queue on
        the row, never on a lock taken to read, so no two upgrade a shared lock into a
        deadlock), a row another transaction is inserting or deleting is waited for, and the
        rows come back with RETURNING where it exists.
        """
        table, key = self.qn(JobSequence._meta.db_table), self.qn("key")
        now = self.connection.ops.adapt_datetimefield_value(timezone.now())
        marks = ", ".join(["(%s, NULL, %s, %s)"] * len(keys))
        sql = (
            f"INSERT INTO {table} ({key}, head, created_at, updated_at) VALUES {marks} "
            + self._touch_on_conflict(key)
        )
        params = [value for name in keys for value in (name, now, now)]
        with self.cursor() as cursor:
            if self.can_return_rows_from_update:
                cursor.execute(f"{sql} RETURNING {key}, head", params)
                return dict(cursor.fetchall())
            cursor.execute(sql, params)
            where, params = self.in_sql(key, keys)
            cursor.execute(
                f"SELECT {key}, head FROM {table} WHERE {where}{self.blocking_lock_sql}", params
            )
            return dict(cursor.fetchall())

    def _touch_on_conflict(self, key: str) -> str:
        """The clause of `lock_sequences` that updates (so locks) the row already there."""
        return f"ON CONFLICT ({key}) DO UPDATE SET updated_at = EXCLUDED.updated_at"
