"""The dialect's wiring: class `Dialect`, its capability flags, and the parts it is made of.

`Dialect` composes one mixin per concept, as Django's `db/backends/base/` splits operations,
features, schema and creation; each module says what it owns:

- `sql.py`: the connection, quoting, compiling, the clock, small SQL fragments;
- `transactions.py`: write transactions, retries on lock contention, wait bounds, savepoints;
- `claims.py`: the claim, the worker's hot path from ready rows to running jobs;
- `finishing.py`: ending leases with an outcome, fenced by the lease;
- `promotion.py`: waiting and due scheduled jobs made runnable;
- `inserts.py`: bulk inserts of jobs, counter upserts;
- `steps.py`: the fenced records of durable calls;
- `resources.py`: the locked rows of limits' resources, and a running job's grant;
- `sequences.py`: the locked rows of job sequences;
- `server.py`: server checks, session name, wake-ups, table upkeep.

The portable versions use the ORM where it is fast enough; a vendor (`postgresql.py`,
`mysql.py`, `sqlite.py`) subclasses `Dialect` and overrides only what differs, so its methods
win over every mixin's. The names this module exported before the split are re-exported.
"""

from __future__ import annotations

from typing import Any

from .claims import (
    ARGS,
    MERGED_QUEUES,
    MERGED_READS,
    Claims,
    merged_queues,
    served_queues,
)
from .finishing import Finishing, terminal_columns
from .inserts import Inserts, JobDocument
from .promotion import Promotion
from .resources import GrantWrite, LockedResources, Resources
from .sequences import Sequences
from .server import Server
from .sql import MAX_DELAY, StatementCache, aware, read_json, result_of, seconds
from .steps import Steps
from .transactions import M, T, TransientDatabaseError, logger, statement_bound

__all__ = [
    "ARGS",
    "MAX_DELAY",
    "MERGED_QUEUES",
    "MERGED_READS",
    "Dialect",
    "GrantWrite",
    "JobDocument",
    "LockedResources",
    "M",
    "T",
    "TransientDatabaseError",
    "aware",
    "logger",
    "merged_queues",
    "read_json",
    "result_of",
    "seconds",
    "served_queues",
    "statement_bound",
    "terminal_columns",
]


class Dialect(Claims, Finishing, Promotion, Steps, Inserts, Resources, Sequences, Server):
    """How one database claims, locks and retries; subclasses override only what differs."""

    vendor = "unknown"
    # Whether SELECT ... FOR UPDATE SKIP LOCKED gives row-level claims.
    has_select_for_update_skip_locked = True
    # Whether UPDATE ... RETURNING exists: the claim and the finish are then one statement.
    can_return_rows_from_update = False
    # Whether a running job's grant (its clock, window read, record and rows) is one statement
    # (`grant_sql`): data-modifying WITH clauses.
    can_grant_in_one_statement = False
    # Whether a running job's deferred records (settlements that give back) may be written in
    # its next grant's transaction, beside the grant's own spend row (`budgets._grant`).
    can_defer_into_grant = True
    # Whether the database can push a wake-up to idle workers (LISTEN/NOTIFY).
    supports_listen_notify = False
    # Whether maintain() has upkeep to do (the worker runs its maintainer duty then).
    maintains_tables = False
    # Whether an index answers `args @> {...}` (the admin's argument search adds that test).
    indexes_json_containment = False
    # Human-readable name of the claim strategy, for the worker's start-up line.
    claim_strategy = "SELECT ... FOR UPDATE SKIP LOCKED"

    def __init__(self, using: str) -> None:
        self.using = using
        self._sql_cache = StatementCache()
        self._loaders: dict[Any, list[Any]] = {}
