"""Bad rows set aside: a ready job whose row no claim can read or start ends `dead`.

`enqueue()` refuses what no job may hold, but a row can be written around it (a raw INSERT, a
migration, another program): text that cannot be encoded or decoded, `uses` that are not a map
of resource names to units, JSON that does not parse. Such a row would fail every claim that
reads it, and with it every other job. A claim therefore checks the `uses` of its candidates
(`bad_uses`) and leaves a bad one out; and when a claim fails all the same, the worker looks
at the rows it was reading (`probe`), one by one, and sets the bad ones aside (`set_aside`):
`dead`, with an `UnreadableJob` error that says why, its workflow reacting as to any death.
The worker backs off only when no row was to blame: the database itself was.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from django.db import DatabaseError, InterfaceError

from ..dialects import Dialect
from ..dialects.base import read_json
from ..exceptions import UnreadableJob
from ..models import Job, JobQuerySet
from ..validation import INT_MAX, name_problem
from . import workflows
from .error_records import error_record, log_text

logger = logging.getLogger("django_jobqueue.quarantine")

# The ready jobs a probe reads, in claim order, besides the planned groups' own.
PROBE_ROWS = 200


def bad_uses(raw: Any) -> tuple[dict[str, int] | None, str | None]:
    """Return a row's `uses` (as a raw cursor gave it) and None, or None and why no claim can
    start a job with them."""
    try:
        uses = read_json(raw)
    except ValueError as exc:
        return None, f"its uses are not JSON ({exc})"
    if uses is None:
        return None, None
    if not isinstance(uses, dict):
        return None, f"its uses are not a map of resource names to units: {uses!r}"
    for name, units in uses.items():
        problem = name_problem(name, 255, star="none")
        if problem:
            return None, f"its uses name a resource that {problem}"
        if isinstance(units, bool) or not isinstance(units, int) or not 1 <= units <= INT_MAX:
            return None, f"its uses give {name!r} {units!r} units, not an integer >= 1"
    return uses, None


def probe(dialect: Dialect, ready: JobQuerySet, planned: Mapping[str, int]) -> dict[int, str]:
    """Read, one at a time, the rows a claim of `ready` reads first (and those of the groups
    it `planned`, each up to its count); return {id: why} for those no claim can start.

    A database error on one row (SQLite decoding its text, say) blames that row while the
    connection stays usable; otherwise it is the database's, and raised.
    """
    ordered = ready.order_by("-priority", "pk").values_list("pk", flat=True)
    ids = dict.fromkeys(ordered[:PROBE_ROWS])
    for group, count in planned.items():
        ids.update(dict.fromkeys(ordered.filter(group_key=group)[:count]))
    found: dict[int, str] = {}
    columns = dialect.claim_columns()
    table = dialect.qn(Job._meta.db_table)
    for pk in ids:
        try:
            with dialect.connection.cursor() as cursor:
                cursor.execute(f"SELECT {columns}, uses FROM {table} WHERE id = %s", [pk])
                rows = cursor.fetchall()
            if rows:
                dialect.load_claimed([rows[0][:-1]])
                _, problem = bad_uses(rows[0][-1])
                if problem:
                    found[pk] = problem
        except (DatabaseError, InterfaceError) as exc:
            if not usable(dialect):
                raise
            found[pk] = f"its row cannot be read ({type(exc).__name__}: {exc})"
        except Exception as exc:  # decoding, conversion: this row's, not the database's
            found[pk] = f"its row cannot be read ({type(exc).__name__}: {exc})"
    return found


def usable(dialect: Dialect) -> bool:
    """Whether this thread's connection is open and answers (a ping)."""
    conn = dialect.connection
    try:
        return conn.connection is not None and conn.is_usable()
    except Exception:
        return False


def set_aside(dialect: Dialect, reasons: Mapping[int, str]) -> list[int]:
    """Make the ready jobs of `reasons` ({id: why}) `dead` with an UnreadableJob error, in one
    transaction, their workflows reacting; return the ids set aside (those still ready).

    Reads nothing of the rows but what any row can give (their ids and links): their other
    columns may be what cannot be read.
    """
    if not reasons:
        return []

    def txn() -> list[int]:
        jobs = Job.objects.using(dialect.using)
        rows = list(
            dialect.lock(jobs.filter(pk__in=list(reasons), state=Job.State.READY))
            .order_by("pk")
            .values_list("pk", "parent_id", "has_dependents")
        )
        for pk, parent_id, has_dependents in rows:
            error = error_record(UnreadableJob, _message(reasons[pk]), None)
            jobs.filter(pk=pk).update(
                **workflows.terminal_values(Job.State.DEAD, last_error=error, errors=[error])
            )
            workflows.on_terminal(
                dialect, pk, Job.State.DEAD, parent_id, has_dependents=has_dependents
            )
        return [pk for pk, _, _ in rows]

    done = dialect.run_in_transaction(txn)
    for pk in done:
        logger.error("Set job id=%s aside (dead): %s", pk, log_text(_message(reasons[pk])))
    return done


def _message(reason: str) -> str:
    return f"no claim can start this job: {reason}; it was set aside without running"
