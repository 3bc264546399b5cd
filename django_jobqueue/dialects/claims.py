"""The claim: the worker's hot path from ready rows to running jobs under a lease.

Owns the claim's SQL (the locked choice of the best ready jobs, each queue read through its
own index and merged where a worker serves a few; the per-group reads of fair share), the SET
list that marks claimed rows running, and turning claimed rows into `ClaimedJob` records with
Django's own converters. The portable claim is a locking read, then an UPDATE by ids; a
dialect whose database returns rows from an UPDATE overrides `claim_ready` and `mark_claimed`
with one statement built from these pieces.

Invariant: a claimed row is locked (SKIP LOCKED where the database has row locks) from its
read to its mark, in the caller's transaction; compiled statements are kept per shape and
limit, and never depend on the time they were built (the clock is SQL).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.db import transaction
from django.db.models import F, Field, QuerySet
from django.db.models.functions import Coalesce

from .. import registry, versions
from ..lease_results import CLAIM_FIELDS, ClaimedJob
from ..models import READY_QUEUE_INDEX, Job, JobQuerySet
from ..models.functions import DbNow
from .sql import seconds
from .transactions import Transactions

ARGS = CLAIM_FIELDS.index("args")

_MARK = "\x00group"  # group_reads_sql(): the group's place among a read's parameters
MERGED_READS = 32  # group_reads_sql(): the most groups' reads in one UNION ALL

# A claim of at most this many queues (a worker's --queue list) reads each queue's ready
# index and merges them (Dialect.compile_merged); a claim of more reads the ready index.
MERGED_QUEUES = 8


def served_queues(shape: Any) -> list[str]:
    """The queues a claim of `shape` (queues, handler types, paused queues) names and may
    take jobs of (not paused), each once; none when it names none (all queues)."""
    return [] if shape is None else [q for q in dict.fromkeys(shape[0]) if q not in shape[2]]


def merged_queues(shape: Any) -> list[str]:
    """The queues whose reads a claim of `shape` merges (compile_merged): its served queues
    if they are two to MERGED_QUEUES; else none (it reads the ready index, or one queue's)."""
    queues = served_queues(shape)
    return queues if 1 < len(queues) <= MERGED_QUEUES else []


def _claim_fields(model: Any) -> list[Field[Any, Any]]:
    return [model._meta.get_field(name.removesuffix("_id")) for name in CLAIM_FIELDS]


class Claims(Transactions):
    """The claim's SQL, its marking of rows running, and the records it hands back."""

    # Set by Dialect.__init__ (base.py): load_claimed()'s converters, per connection.
    _loaders: dict[Any, list[Any]]

    def claim_ready(
        self,
        ready: JobQuerySet,
        *,
        owner: str,
        limit: int,
        lease_ttl: float,
        shape: Any = None,
    ) -> list[ClaimedJob]:
        """Lock up to `limit` of the `ready` jobs in claim order and mark them running.

        Runs inside the claim transaction. Portable version: a locking read, then an UPDATE
        by ids (two statements). `shape`: see compile_claim().
        """
        if queues := merged_queues(shape):  # a few queues: each one's index, merged
            key = ("claim_rows", shape, limit)
            if key not in self._sql_cache:
                self._sql_cache[key] = self.compile_merged(ready, limit, queues, ids=False)
            sql, params = self._sql_cache[key]
            with self.cursor() as cursor:
                cursor.execute(sql, params)
                jobs = self.load_claimed(cursor.fetchall())
            return self._mark(jobs, owner=owner, lease_ttl=lease_ttl)
        best = self.lock(ready.order_by("-priority", "pk")).values_list(*CLAIM_FIELDS)[:limit]
        # A worker that serves one queue reads that queue's own index: through the ready
        # index it would read every other queue's ready jobs ahead of its own.
        one_queue = [READY_QUEUE_INDEX] if len(served_queues(shape)) == 1 else []
        rows = self.read_through(best, one_queue)
        return self._mark(self._from_orm(rows), owner=owner, lease_ttl=lease_ttl)

    def mark_claimed(
        self, ids: list[int], *, owner: str, lease_ttl: float, last: bool = False
    ) -> list[ClaimedJob]:
        """Mark the locked jobs `ids` running under a new lease of `owner`; return them.

        `last`: the caller runs nothing more in its transaction (run_in_transaction's), so a
        dialect may commit it with this statement; here it is committed as ever, after it.
        """
        if not ids:
            return []
        rows = Job.objects.using(self.using).filter(pk__in=ids).values_list(*CLAIM_FIELDS)
        found = {job.id: job for job in self._from_orm(rows)}
        return self._mark([found[i] for i in ids if i in found], owner=owner, lease_ttl=lease_ttl)

    def _from_orm(self, rows: Iterable[Sequence[Any]]) -> list[ClaimedJob]:
        """ClaimedJob records from ORM `values_list(*CLAIM_FIELDS)` rows (converted already)."""
        return [ClaimedJob(self.using, row) for row in rows]

    def _mark(self, jobs: list[ClaimedJob], *, owner: str, lease_ttl: float) -> list[ClaimedJob]:
        if not jobs:
            return []
        served = registry.served()
        version = versions.first_version(served)
        rows = Job.objects.using(self.using).filter(pk__in=[j.id for j in jobs])
        rows.update(
            state=Job.State.RUNNING,
            attempts=F("attempts") + 1,
            lease_owner=owner,
            lease_expires=DbNow() + seconds(lease_ttl),
            heartbeat_at=DbNow(),
            started_at=DbNow(),
            # Before first_started_at, which it reads: MySQL's UPDATE assigns left to right,
            # each assignment seeing the values assigned before it.
            **({} if version is None else {"handler_version": version}),
            first_started_at=Coalesce(F("first_started_at"), DbNow()),
            updated_at=DbNow(),
            worker_ids=self.json_append("worker_ids", owner),
        )
        for job in jobs:
            job.state = Job.State.RUNNING
            job.attempts += 1
            job.lease_owner = owner
        if version is not None:
            # The rows were read before the UPDATE: read back the versions it may have given.
            pinned = [
                j.id for j in jobs if not j.handler_version and versions.newest_of(served, j.type)
            ]
            if pinned:
                found = dict(rows.filter(pk__in=pinned).values_list("pk", "handler_version"))
                for job in jobs:
                    job.handler_version = found.get(job.id, job.handler_version)
        return jobs

    def compile_claim(
        self, ready: JobQuerySet, limit: int, shape: Any = None
    ) -> tuple[str, list[Any]]:
        """The SQL of the claim's choice: the ids of the best `limit` ready jobs, locked.

        With `shape` (what tells this `ready` queryset from others: the queues), it is
        compiled by the ORM once and kept: the ready filter uses the database clock in SQL,
        so the statement never changes for a given shape and limit.
        """
        key = ("claim", shape, limit)
        if shape is None or key not in self._sql_cache:
            if queues := merged_queues(shape):
                self._sql_cache[key] = self.compile_merged(ready, limit, queues, ids=True)
            else:
                self._sql_cache[key] = self.compile_locked(
                    ready.order_by("-priority", "pk").values("pk"), limit
                )
        sql, params = self._sql_cache[key]
        return sql, list(params)

    def compile_merged(
        self, ready: JobQuerySet, limit: int, queues: Sequence[str], *, ids: bool
    ) -> tuple[str, list[Any]]:
        """The SQL of the best `limit` ready jobs of several `queues`, each queue's read from
        its own index (READY_QUEUE_INDEX) and locked there, the reads merged in claim order.

        Read through the ready index, a claim of queues `a` and `b` would read the ready jobs
        of every other queue ahead of theirs. Each queue's read locks up to `limit` rows (SKIP
        LOCKED): the rows the merge leaves out stay locked until the claim's transaction ends.
        It selects the jobs' ids (`ids`), or their CLAIM_FIELDS.
        """
        fields = ("id", "priority") if ids else CLAIM_FIELDS
        columns = "u.id" if ids else self.claim_columns("u.")
        branches, params = [], []
        for n, queue in enumerate(queues):
            best = ready.filter(queue=queue).order_by("-priority", "pk").values_list(*fields)
            sql, branch_params = self.compile_locked(best, limit)
            branches.append(f"SELECT * FROM ({self.hinted_sql(sql, [READY_QUEUE_INDEX])}) AS q{n}")
            params += branch_params
        merged = " UNION ALL ".join(branches)
        sql = f"SELECT {columns} FROM ({merged}) AS u ORDER BY u.priority DESC, u.id LIMIT {limit}"
        return sql, params

    def compile_locked(self, queryset: QuerySet[Any], limit: int) -> tuple[str, list[Any]]:
        """The SQL and parameters of the first `limit` rows of `queryset`, with the claim's
        row locks (lock()), for a raw statement."""
        locked = self.lock(queryset)[:limit]
        if self.connection.in_atomic_block:  # a claim's: no savepoint (two round trips)
            return self.compile_query(locked)
        # select_for_update() compiles only inside a transaction (even in autocommit use).
        with transaction.atomic(using=self.using):
            return self.compile_query(locked)

    def hinted_sql(self, sql: str, indexes: Sequence[str]) -> str:
        """`sql`, a SELECT of ready jobs from the job table (compiled by the ORM), reading the
        table through one of `indexes` where this database's optimizer needs telling. Here:
        as it is (the planner picks them by itself)."""
        return sql

    def read_through(self, query: QuerySet[Any], indexes: Sequence[str]) -> list[Any]:
        """The rows of `query`, a `values_list` of ready jobs, read through one of `indexes`
        (`hinted_sql`). Here: as the ORM reads them."""
        return list(query)

    def group_reads_sql(
        self,
        query: QuerySet[Any],
        reads: Sequence[tuple[str, int]],
        indexes: Sequence[str],
        compiled: dict[Any, Any],
    ) -> list[tuple[str, list[Any]]]:
        """The statements (SQL and parameters) that lock, for each (group, count) of `reads`,
        the first `count` rows of `query` (a `values_list` of ready jobs in claim order) of
        that group, read through one of `indexes`. With several reads each row comes with the
        index of its read in `reads` first, in no set order (a dialect may return up to the
        largest count of the reads for each: the caller keeps the first `count` of each read
        in claim order); one read's rows come as they are. `compiled` keeps what is compiled
        for `query` between calls (the caller's: one per query).

        Here: each read compiled by the ORM once per count, its group a parameter, the reads
        joined by UNION ALL, up to MERGED_READS a statement and within the database's limit
        of parameters (SQLite's may be 999, and each read repeats the ready filter's).
        """
        if len(reads) > 1 and (merged := self.merged_group_reads_sql(query, reads, compiled)):
            return [merged]
        statements: list[tuple[str, list[Any]]] = []
        branches: list[str] = []
        params: list[Any] = []
        most = self.connection.features.max_query_params or 65535
        for n, (group, count) in enumerate(reads):
            if count not in compiled:
                sql, branch_params = self.compile_locked(query.filter(group_key=_MARK), count)
                compiled[count] = (self.hinted_sql(sql, indexes), branch_params)
            sql, branch_params = compiled[count]
            if branches and (
                len(branches) >= MERGED_READS or len(params) + len(branch_params) > most
            ):
                statements.append((" UNION ALL ".join(branches), params))
                branches, params = [], []
            if len(reads) > 1:
                sql = f"SELECT {n} AS jq_read, r{n}.* FROM ({sql}) AS r{n}"
            branches.append(sql)
            params += [group if p == _MARK else p for p in branch_params]
        if branches:
            statements.append((" UNION ALL ".join(branches), params))
        return statements

    def merged_group_reads_sql(
        self, query: QuerySet[Any], reads: Sequence[tuple[str, int]], compiled: dict[Any, Any]
    ) -> tuple[str, list[Any]] | None:
        """One statement of all the (several) `reads` of `group_reads_sql`, where this
        database has a better form than a UNION ALL of them; else None (here)."""
        return None

    def claim_sets(self, owner: str, lease_ttl: float, prefix: str = "") -> tuple[str, list[Any]]:
        """The SET list (raw SQL, and its parameters) of marking claimed rows running.

        Built once per lease TTL from the ORM's own SQL for the database clock; `prefix`
        qualifies the columns read (a table alias and a dot).
        """
        served = registry.served()
        key = ("claim_sets", lease_ttl, prefix, served)
        if key not in self._sql_cache:
            now, _ = self.compile(DbNow())
            expires, expires_params = self.compile(DbNow() + seconds(lease_ttl))
            version, version_params = self.first_version_sql(served, prefix)
            self._sql_cache[key] = (
                f"state = 'running', attempts = {prefix}attempts + 1, lease_owner = %s, "
                f"lease_expires = {expires}, heartbeat_at = {now}, started_at = {now}, "
                f"{version}first_started_at = COALESCE({prefix}first_started_at, {now}), "
                f"updated_at = {now}, "
                f"worker_ids = {self.json_append_sql(prefix + 'worker_ids')}",
                [*expires_params, *version_params],
            )
        sql, params = self._sql_cache[key]
        return sql, [owner, *params, owner]

    def first_version_sql(self, served: versions.Served, prefix: str = "") -> tuple[str, list[Any]]:
        """The SET item (raw SQL ending in ", ", and its parameters) that gives a job not
        started yet the newest version of its handler in `served` (versions.first_version);
        empty when every newest version is "". Placed before first_started_at's, which it
        reads (see _mark)."""
        pinned = versions.newest(served)
        if not pinned:
            return "", []
        whens, params = [], []
        for version, keys in pinned:
            whens.append(f"WHEN {prefix}type IN ({', '.join(['%s'] * len(keys))}) THEN %s")
            params += [*keys, version]
        column = f"{prefix}handler_version"
        return (
            f"handler_version = CASE WHEN {prefix}first_started_at IS NULL THEN CASE "
            f"{' '.join(whens)} ELSE {column} END ELSE {column} END, ",
            params,
        )

    def claim_columns(self, prefix: str = "") -> str:
        """The columns a claim returns (CLAIM_FIELDS), for raw SQL (built once per prefix)."""
        key = ("claim_columns", prefix)
        if key not in self._sql_cache:
            columns = ", ".join(prefix + self.qn(str(f.column)) for f in _claim_fields(Job))
            self._sql_cache[key] = (columns, [])
        return self._sql_cache[key][0]

    def load_claimed(self, rows: Iterable[Sequence[Any]]) -> list[ClaimedJob]:
        """Build ClaimedJob records from raw rows of `claim_columns()`.

        Django's own converters are applied, so values are what the ORM would give.
        """
        conn = self.connection
        key = ("load_claimed", id(conn))
        if key not in self._loaders:
            converters = []
            for n, field in enumerate(_claim_fields(Job)):
                col = field.get_col(Job._meta.db_table)
                found = conn.ops.get_db_converters(col) + field.get_db_converters(conn)
                if found:
                    converters.append((n, found, col))
            self._loaders[key] = converters
        converters = self._loaders[key]
        jobs = []
        for row in rows:
            values = list(row)
            for n, found, col in converters:
                value = values[n]
                if value == "{}" and n == ARGS:  # the usual no-argument job: no JSON parse
                    values[n] = {}
                    continue
                for convert in found:
                    value = convert(value, col, conn)
                values[n] = value
            jobs.append(ClaimedJob(self.using, values))
        return jobs
