"""PostgreSQL: row claims with FOR UPDATE SKIP LOCKED in READ COMMITTED transactions, one
statement per claim and per finished batch (UPDATE ... RETURNING), and LISTEN/NOTIFY."""

from __future__ import annotations

import functools
import json
import select
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError
from django.db.backends.postgresql.psycopg_any import IsolationLevel
from django.db.models.expressions import RawSQL

from .. import models
from ..lease_results import Finished, FinishReport
from ..models import Job, JobDependency, JobQuerySet, JobSequence, JobStep, JobWait
from ..models.functions import DbNow
from ..models.literals import array
from .base import Dialect
from .resources import GrantWrite
from .sql import result_of, seconds
from .transactions import statement_bound

try:
    from psycopg import ClientCursor
    from psycopg.pq import TransactionStatus

    _CLIENT_CURSORS: tuple[type, ...] = (ClientCursor,)
    _IDLE: Any = TransactionStatus.IDLE
except ImportError:  # psycopg2: its statements are sent apart
    _CLIENT_CURSORS = ()
    _IDLE = None


def _client_side(cursor: Any) -> Any | None:
    """The driver's cursor under Django's `cursor` if it binds parameters on the client
    (psycopg 3 without server_side_binding, Django's default), else None. Such a cursor sends
    a query of several statements as one simple query: one round trip, each statement with a
    snapshot of its own at READ COMMITTED; `nextset()` steps to the next one's result."""
    raw = cursor.cursor
    return raw if isinstance(raw, _CLIENT_CURSORS) else None


def _write_in_one(
    cursor: Any, statements: Sequence[tuple[str, list[Any]]], tail: str = ""
) -> list[int]:
    """Send the writes `statements` as one query (a `_client_side` cursor), `tail` after them;
    return each one's row count."""
    cursor.execute(
        "; ".join(sql for sql, _ in statements) + tail,
        [p for _, params in statements for p in params],
    )
    counts = [cursor.rowcount]
    for _ in statements[1:]:
        cursor.cursor.nextset()
        counts.append(cursor.rowcount)
    return counts


def _own_begin(conn: Any) -> str:
    """The text `BEGIN; ` if the transaction's BEGIN can go with its first statement, else "".

    psycopg 3 sends the BEGIN of a transaction on its own, a round trip, when Django's
    atomic() has turned its autocommit off. Where the connection would send a plain BEGIN
    (no isolation level, read-only or deferrable mode of its own) and none is sent yet, its
    autocommit goes back on (allowed while no transaction is open) so that it sends none, and
    the caller sends the BEGIN itself, with the statement; `_after_begin` then puts the flag
    back. psycopg's commit() and rollback() act on the server's transaction status, so
    Django's atomic() ends the transaction as usual.
    """
    if (
        conn.autocommit
        or not hasattr(conn, "_autocommit")  # the flag could not be put back
        or conn.info.transaction_status != _IDLE
        or conn.isolation_level is not None
        or conn.read_only is not None
        or conn.deferrable is not None
    ):
        return ""
    conn.autocommit = True
    return "BEGIN; "


def _after_begin(conn: Any) -> None:
    """Turn psycopg's autocommit off again once the query with our BEGIN has run or failed.

    Inside the transaction psycopg must see what Django set: autocommit off (Django asks it,
    for one, whether a named cursor must be WITH HOLD). Its setter refuses while a transaction
    is open, hence the attribute. If the query never reached the server (psycopg refused its
    parameters), no transaction is open: the setter does, and psycopg's own BEGIN comes with
    the block's next statement, as without us.
    """
    if conn.info.transaction_status == _IDLE:
        conn.autocommit = False
    else:
        conn._autocommit = False


if TYPE_CHECKING:
    from django.db.models import QuerySet

    from ..lease_results import ClaimedJob

# SQLSTATEs worth retrying the whole transaction for: serialization failure, deadlock, and
# lock_not_available (a lock wait ran into the worker's lock_timeout).
_TRANSIENT_SQLSTATES = {"40001", "40P01", "55P03"}
CHANNEL = "django_jobqueue"  # the LISTEN/NOTIFY channel; the payload is the queue's name
_TRIGGER_FUNCTION = "django_jobqueue_notify_ready"
# group_reads_sql(): the LIMIT compiled in, then replaced by each read's count.
_LIMIT_MARK = 987_654_321


def isolation_level(settings_dict: dict[str, Any]) -> str | None:
    """Return the isolation level configured in OPTIONS as SQL ('READ COMMITTED'), or None.

    Takes a psycopg `IsolationLevel` member or its number (psycopg2's ISOLATION_LEVEL_*
    constants), read as Django reads it, or a level's name.
    """
    level = settings_dict.get("OPTIONS", {}).get("isolation_level")
    if level is None:
        return None
    if isinstance(level, str):
        name = level.upper().replace("_", " ").removeprefix("ISOLATIONLEVEL.")
        return " ".join(name.split())
    # str() of an IntEnum member is its number from Python 3.11: read it by value.
    try:
        return IsolationLevel(level).name.replace("_", " ")
    except ValueError:
        return str(level)  # Django refuses it when it connects


class PostgreSQLDialect(Dialect):
    vendor = "postgresql"
    can_return_rows_from_update = True
    can_grant_in_one_statement = True
    supports_listen_notify = True
    maintains_tables = True
    indexes_json_containment = True  # the GIN index of migration 0025
    claim_strategy = "UPDATE ... RETURNING over SELECT ... FOR UPDATE SKIP LOCKED (READ COMMITTED)"

    def begin(self) -> None:
        # READ COMMITTED is PostgreSQL's default; pin it only when the project configured
        # another level, so each claim statement sees rows committed after the transaction began.
        if not self._read_committed():
            with self.connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")

    def _read_committed(self) -> bool:
        """Whether the connection's transactions run at READ COMMITTED unless told otherwise."""
        return isolation_level(self.connection.settings_dict) in (None, "READ COMMITTED")

    def clock_sql(self) -> tuple[str, list[Any]]:
        # now() is the time the transaction began; a transaction that waited for a lock
        # must see the time it reads the clock.
        return "CLOCK_TIMESTAMP()", []

    def uses_any_sql(self, names: Sequence[str]) -> tuple[str, list[Any]]:
        return "uses ?| %s::text[]", [array(names)]

    def in_sql(self, column: str, values: Sequence[str]) -> tuple[str, list[Any]]:
        # One array parameter: the statement's text is the same for any number of values.
        return f"{column} = ANY(%s::text[])", [array(values)]

    def merged_group_reads_sql(
        self, query: QuerySet[Any], reads: Sequence[tuple[str, int]], compiled: dict[Any, Any]
    ) -> tuple[str, list[Any]] | None:
        # One LATERAL read per (group, count) of two arrays: one statement text for any
        # number of reads, planned in a fraction of the time of a UNION of as many branches
        # (ten reads: 0.2 ms against 1.2 ms of planning).
        if "lateral" not in compiled:
            by_read = query.filter(group_key=RawSQL("jq_r.name", ()))
            sql, params = self.compile_locked(by_read, _LIMIT_MARK)
            limit = f"LIMIT {_LIMIT_MARK}"
            if sql.count(limit) != 1:  # the ORM's SQL changed shape: say so, never guess
                raise RuntimeError(f"cannot place each read's count in: {sql}")
            sql = sql.replace(limit, "LIMIT jq_r.n")
            compiled["lateral"] = (
                "SELECT jq_r.i - 1, r.* FROM unnest(%s::varchar[], %s::int[]) WITH ORDINALITY"
                f" AS jq_r(name, n, i) CROSS JOIN LATERAL ({sql}) AS r",
                params,
            )
        sql, params = compiled["lateral"]
        groups, counts = [group for group, _ in reads], [count for _, count in reads]
        return sql, [array(groups), array(counts), *params]

    def _ends_with_this(self, cursor: Any) -> bool:
        """Whether the next statement of `cursor` may carry the COMMIT of its transaction:
        a query of several statements is possible (`_client_side`), and the transaction is
        the outermost block's own, which commits on exit (not a savepoint of a caller's)."""
        conn: Any = self.connection
        return (
            _client_side(cursor) is not None
            and conn.in_atomic_block
            and len(conn.atomic_blocks) == 1
            and not conn.savepoint_ids
            and conn.commit_on_exit
            and not conn.needs_rollback
        )

    def execute_together(
        self, statements: list[tuple[str, list[Any]]], *, last: bool = False
    ) -> list[Any]:
        # One round trip where the cursor allows (`_client_side`): a claim under LIMITS sends
        # the lock of its resources and the read of their jobs in flight so, and the read
        # still takes its snapshot once the lock is held.
        # The transaction's BEGIN goes with them where it has not been sent (`_own_begin`),
        # unless a wrapper (transaction_waits) puts statements of its own first.
        with self.cursor() as cursor:
            raw = _client_side(cursor)
            if len(statements) < 2 or raw is None:
                return super().execute_together(statements)
            begin = "" if self.connection.execute_wrappers else _own_begin(raw.connection)
            commit = "; COMMIT" if last and self._ends_with_this(cursor) else ""
            try:
                cursor.execute(
                    begin + "; ".join(sql for sql, _ in statements) + commit,
                    [p for _, params in statements for p in params],
                )
            finally:
                if begin:
                    _after_begin(raw.connection)
            if begin:
                raw.nextset()  # past the BEGIN's result
            results = [result_of(cursor)]
            for _ in statements[1:]:
                raw.nextset()
                results.append(result_of(cursor))
        return results

    def grant_sql(self, grant: GrantWrite) -> tuple[str, list[Any]]:
        # Data-modifying WITH clauses: the grant's decision and writes in one statement, sent
        # with the lock (and the COMMIT) in one round trip. The clock is read once (t, read
        # after the lock, which the statement before took), so the record, the window's row
        # and the minute of the spend all carry the time the window was read at.
        resource, units, cap, (read_sql, read_params), (name, seq, place), lease, handler = grant
        values = self._record_values(name, seq, place, None, lease[2], None)
        params = [
            *read_params, resource, units, cap,
            values[0], values[1], values[2], resource, units, values[4], values[6], *lease,
            resource, units, models.ResourceStart.Kind.GRANT.value,
            resource, handler, units,
        ]  # fmt: skip
        # Only the window's read varies in the text (by its resources' period): built once a
        # shape, as every grant of a job of many calls sends it.
        key = ("grant", read_sql)
        if key not in self._sql_cache:
            self._sql_cache[key] = (self._grant_text(read_sql), [])
        return self._sql_cache[key][0], params

    def _grant_text(self, read_sql: str) -> str:
        step, job = self.qn(JobStep._meta.db_table), self.qn(Job._meta.db_table)
        limit = self.qn(models.Limit._meta.db_table)
        starts = self.qn(models.ResourceStart._meta.db_table)
        spend = self.qn(models.MinuteSpend._meta.db_table)
        states = ", ".join(f"'{state}'" for state in Job.LEASED_STATES)
        iso = '\'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"\''  # as Python's isoformat() reads it
        on_conflict = self._add_on_conflict(spend, ("minute", "resource", "handler"), "units")
        return (
            "WITH t AS (SELECT CLOCK_TIMESTAMP() AS now), "
            f"w (resource, n, first) AS ({read_sql}), "
            f"l AS (SELECT closed_until FROM {limit} WHERE name = %s), "
            "ok AS (SELECT t.now FROM t WHERE EXISTS (SELECT 1 FROM l) "
            "AND NOT EXISTS (SELECT 1 FROM l WHERE l.closed_until > t.now) "
            "AND COALESCE((SELECT SUM(w.n) FROM w), 0) + %s <= %s), "
            f"rec AS (INSERT INTO {step} (job_id, name, seq, place, result, attempt, duration, "
            "created_at) SELECT j.id, %s, %s, %s, jsonb_build_object('resource', %s::text, "
            f"'units', %s::integer, 'granted_at', to_char(ok.now AT TIME ZONE 'UTC', {iso})), "
            f"%s, NULL, %s FROM {job} j, ok WHERE j.id = %s AND j.lease_owner = %s "
            f"AND j.attempts = %s AND j.state IN ({states}) FOR UPDATE OF j RETURNING 1), "
            f"g AS (INSERT INTO {starts} (resource, started_at, units, kind, used) "
            "SELECT %s, ok.now, %s, %s, NULL FROM ok WHERE EXISTS (SELECT 1 FROM rec)), "
            f"s AS (INSERT INTO {spend} (minute, resource, handler, units) "
            "SELECT date_trunc('minute', ok.now AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', %s, %s, "
            f"%s FROM ok WHERE EXISTS (SELECT 1 FROM rec) {on_conflict}) "
            "SELECT t.now, (SELECT closed_until FROM l), COALESCE((SELECT SUM(w.n) FROM w), 0), "
            "(SELECT MIN(w.first) FROM w), (SELECT count(*) FROM rec) FROM t"
        )

    def write_together(
        self, statements: Sequence[tuple[str, list[Any]]], *, last: bool = False
    ) -> list[int]:
        # One round trip; with `last`, the COMMIT in it too (see mark_claimed).
        with self.cursor() as cursor:
            if len(statements) < 2 or _client_side(cursor) is None:
                return super().write_together(statements, last=last)
            commit = "; COMMIT" if last and self._ends_with_this(cursor) else ""
            return _write_in_one(cursor, statements, commit)

    def write_alone(self, statements: Sequence[tuple[str, list[Any]]]) -> list[int]:
        # Outside a transaction, one query of several statements, which PostgreSQL runs as one
        # transaction of its own ("implicit transaction"): one round trip, all or nothing.
        if self.connection.in_atomic_block:
            return super().write_alone(statements)
        with self.cursor() as cursor:
            raw = _client_side(cursor)
            if raw is None or not raw.connection.autocommit:
                return super().write_alone(statements)
            return _write_in_one(cursor, statements)

    def is_transient(self, exc: BaseException) -> bool:
        cause = exc.__cause__
        # psycopg 3 names it sqlstate, psycopg2 pgcode.
        code = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
        return isinstance(exc, DatabaseError) and code in _TRANSIENT_SQLSTATES

    @contextmanager
    def transaction_waits(self, lock_timeout: float, idle_timeout: float | None) -> Iterator[None]:
        # Transaction-local (set_config(..., true) is SET LOCAL): a session-level SET would stay
        # on the server connection, which a transaction-mode pooler (PgBouncer) then hands to
        # other clients. Both settings in one statement, sent with the transaction's first one
        # where the cursor binds parameters on the client (Django's default): a simple query
        # of two statements, one round trip, the settings in force before the second runs.
        values = [("lock_timeout", lock_timeout)]
        if idle_timeout:
            # No statement of the transaction runs longer than it may sit idle either: nothing
            # holds a worker's transaction (and its row locks) open for minutes.
            values.append(("idle_in_transaction_session_timeout", idle_timeout))
            values.append(("statement_timeout", statement_bound(lock_timeout, idle_timeout)))
        settings = ", ".join(
            f"set_config('{name}', '{max(1, int(value * 1000))}ms', true)" for name, value in values
        )
        waits = f"SELECT {settings}"
        pending = True

        def first(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            nonlocal pending
            if not pending:
                return execute(sql, params, many, context)
            pending = False
            raw = _client_side(context["cursor"])
            if many or raw is None:
                # A cursor of its own: the statement's may be a named (server-side) cursor,
                # which would only DECLARE the settings, never run them.
                with context["connection"].cursor() as own:
                    own.execute(waits)
                return execute(sql, params, many, context)
            begin = _own_begin(raw.connection)
            try:
                result = execute(f"{begin}{waits}; {sql}", params, many, context)
            finally:
                if begin:
                    _after_begin(raw.connection)
            for _ in range(2 if begin else 1):
                raw.nextset()  # to the statement's own result
            return result

        with self.connection.execute_wrapper(first):
            yield

    @contextmanager
    def statement_timeout(self, timeout: float) -> Iterator[None]:
        # SET LOCAL ends with the transaction: nothing leaks into the session (nor, through a
        # transaction-mode pooler, into other clients' sessions).
        with self.connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL statement_timeout = '{max(1, int(timeout * 1000))}ms'")
        yield

    # -- wake-up -----------------------------------------------------------------------------

    def notify(self, queues: Iterable[str]) -> None:
        # NOTIFY inside the transaction is delivered at its commit, and never on rollback.
        with self.connection.cursor() as cursor:
            for queue in sorted(set(queues)):
                cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, queue])

    def create_notify_trigger(self, schema_editor: Any, table: str) -> None:
        # One NOTIFY per INSERT statement and queue (not per row), sent by the enqueuing
        # transaction, so producers in any process or host wake the workers on commit.
        qn = schema_editor.quote_name
        schema_editor.execute(
            f"""
            CREATE OR REPLACE FUNCTION {_TRIGGER_FUNCTION}() RETURNS trigger
            LANGUAGE plpgsql AS $$
            BEGIN
                PERFORM pg_notify('{CHANNEL}', q.queue)
                FROM (SELECT DISTINCT queue FROM new_rows WHERE state = 'ready') AS q;
                RETURN NULL;
            END $$
            """
        )
        schema_editor.execute(
            f"CREATE TRIGGER {_TRIGGER_FUNCTION} AFTER INSERT ON {qn(table)} "
            f"REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT "
            f"EXECUTE FUNCTION {_TRIGGER_FUNCTION}()"
        )

    def drop_notify_trigger(self, schema_editor: Any, table: str) -> None:
        qn = schema_editor.quote_name
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {_TRIGGER_FUNCTION} ON {qn(table)}")
        schema_editor.execute(f"DROP FUNCTION IF EXISTS {_TRIGGER_FUNCTION}()")

    def storage_tuning(self) -> list[str]:
        # The jobs table is rewritten row by row all day: free room in each page lets a new
        # row version stay on its page (a HOT update when no indexed column changed), and
        # autovacuum must visit after 1% of the rows died rather than 20%, or dead rows pile
        # up in the ready index between visits. fillfactor applies to pages written from now
        # on (VACUUM FULL or pg_repack rewrite the old ones).
        job, edge = self.qn(Job._meta.db_table), self.qn(JobDependency._meta.db_table)
        return [
            f"ALTER TABLE {job} SET (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.01, "
            "autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_insert_scale_factor = 0.05, "
            "autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 1)",
            f"ALTER TABLE {edge} SET (autovacuum_vacuum_scale_factor = 0.05, "
            "autovacuum_analyze_scale_factor = 0.05)",
        ]

    def name_session(self, name: str) -> None:
        # application_name, as pg_stat_activity shows it (the server cuts it to 63 bytes).
        # A session setting, which PgBouncer tracks per client and restores on whichever
        # server connection it hands that client.
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT set_config('application_name', %s, false)", [name[:63]])

    def maintain(self, *, min_rows: int, fraction: float) -> list[str]:
        # Every claim and finish leaves a dead row version, and its entry in the ready index,
        # until a VACUUM removes them; a claim steps over the dead entries at the front of
        # that index, so it costs more with every job claimed since the last one. Where
        # autovacuum is off or lags behind, the queue vacuums its own tables. SKIP_LOCKED: a
        # table another worker (or autovacuum) is vacuuming is skipped, not waited for.
        tables = [Job._meta.db_table, JobDependency._meta.db_table]
        ran = []
        with self.connection.cursor() as cursor:
            cursor.execute(
                "SELECT s.relname, s.n_live_tup, s.n_dead_tup, s.n_mod_since_analyze, "
                "pg_has_role(c.relowner, 'USAGE') FROM pg_stat_user_tables AS s "
                "JOIN pg_class AS c ON c.oid = s.relid WHERE s.relid = ANY(%s::regclass[])",
                [[self.qn(t) for t in tables]],
            )
            for table, live, dead, changed, owned in cursor.fetchall():
                due = max(min_rows, fraction * live)
                if not owned:  # only the owner may (the server would warn and skip it)
                    continue
                if dead >= due:
                    sql = f"VACUUM (ANALYZE, SKIP_LOCKED) {self.qn(table)}"
                elif changed >= due:  # the planner's row counts are that far off
                    sql = f"ANALYZE (SKIP_LOCKED) {self.qn(table)}"
                else:
                    continue
                cursor.execute(sql)
                ran.append(sql)
        return ran

    def promote(self, ids: Sequence[int]) -> set[str]:
        # One statement: the test for unfinished upstreams is a NOT EXISTS in the UPDATE,
        # the ids one array parameter, and the queues come back with RETURNING. An unfinished
        # awaited job blocks only a job whose wait for `count` of them is not met yet (the
        # count is read only then: a DAG edge never reaches it).
        job = self.qn(Job._meta.db_table)
        edge = self.qn(JobDependency._meta.db_table)
        wait = self.qn(JobWait._meta.db_table)
        # A sequenced job goes only as its sequence's head (sequences.py): the others wait.
        seq = self.qn(JobSequence._meta.db_table)
        now, _ = self.compile(DbNow())
        sql = f"""
            UPDATE {job} AS j
            SET state = CASE WHEN j.run_after > {now} THEN 'scheduled' ELSE 'ready' END,
                updated_at = {now}
            WHERE j.id = ANY(%s::bigint[]) AND j.state = 'waiting'
              AND (j.sequence IS NULL OR EXISTS (
                SELECT 1 FROM {seq} AS s WHERE s.{self.qn("key")} = j.sequence AND s.head = j.id
              ))
              AND NOT EXISTS (
                SELECT 1 FROM {edge} AS e JOIN {job} AS u ON u.id = e.depends_on_id
                WHERE e.job_id = j.id AND u.state <> 'done'
                  AND NOT (e.awaits AND u.state IN ('dead', 'cancelled'))
                  AND NOT (e.awaits AND EXISTS (
                    SELECT 1 FROM {wait} AS w
                    WHERE w.job_id = j.id AND w.{self.qn("count")} <= (
                      SELECT count(*) FROM {edge} AS f JOIN {job} AS v ON v.id = f.depends_on_id
                      WHERE f.job_id = j.id AND f.awaits
                        AND v.state IN ('done', 'dead', 'cancelled')
                    )
                  ))
              )
            RETURNING j.queue
        """
        with self.connection.cursor() as cursor:
            cursor.execute(sql, [array(ids)])
            return {queue for (queue,) in cursor.fetchall()}

    def insert_jobs(self, jobs: list[Job]) -> None:
        # One INSERT ... SELECT over a JSON document, instead of Django's bulk_create (whose
        # per-field preparation of every row was most of enqueue_many()'s time).
        found = self._insert_document(jobs)
        if found is None:
            return super().insert_jobs(jobs)
        values, params = [], []
        for n, field in enumerate(found.fields):
            kind = (
                "jsonb"
                if field.get_internal_type() == "JSONField"
                else field.db_type(self.connection)
            )
            if n in found.constants:
                values.append(f"%s::{kind}")
                params.append(found.constants[n])
            elif kind == "jsonb":
                values.append(f"NULLIF(r->{found.varying.index(n)}, 'null'::jsonb)")
            else:
                values.append(f"(r->>{found.varying.index(n)})::{kind}")
        source = "jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS e(r, n) ORDER BY n"
        self._insert_selected(jobs, found, values, params, source)

    def id_set(self, ids: Sequence[int]) -> Any:
        # One array parameter instead of an IN list of thousands of parameters.
        return RawSQL("SELECT unnest(%s::bigint[])", (array(ids),))

    def listen(self) -> NotificationStream:
        """Return a LISTEN connection of this thread (its own, never used for anything else)."""
        return NotificationStream(self)

    # -- the claim and the finish: one statement each ----------------------------------------

    def claim_ready(
        self,
        ready: JobQuerySet,
        *,
        owner: str,
        limit: int,
        lease_ttl: float,
        shape: Any = None,
    ) -> list[ClaimedJob]:
        inner, params = self.compile_claim(ready, limit, shape)
        sets, set_params = self.claim_sets(owner, lease_ttl, prefix="j.")
        table = self.qn(Job._meta.db_table)
        sql = (
            # The locked rows by primary key (an array): joined to the CTE instead, a batch of
            # about a hundredth of the table was marked through a read of the whole table.
            f"WITH c (id) AS ({inner}) UPDATE {table} AS j SET {sets} "
            f"WHERE j.id = ANY(ARRAY(SELECT id FROM c)) RETURNING {self.claim_columns('j.')}"
        )
        with self.connection.cursor() as cursor:
            cursor.execute(sql, [*params, *set_params])
            rows = self.load_claimed(cursor.fetchall())
        rows.sort(key=lambda r: (-r.priority, r.id))
        return rows

    def mark_claimed(
        self, ids: list[int], *, owner: str, lease_ttl: float, last: bool = False
    ) -> list[ClaimedJob]:
        if not ids:
            return []
        sets, set_params = self.claim_sets(owner, lease_ttl, prefix="j.")
        table = self.qn(Job._meta.db_table)
        sql = (
            f"UPDATE {table} AS j SET {sets} WHERE j.id = ANY(%s::bigint[]) "
            f"RETURNING {self.claim_columns('j.')}"
        )
        order = {pk: n for n, pk in enumerate(ids)}
        with self.cursor() as cursor:
            if last and self._ends_with_this(cursor):
                # The COMMIT in the same query, a round trip fewer; Django's commit at the end
                # of the block then finds no transaction open, and sends nothing.
                sql += "; COMMIT"
            cursor.execute(sql, [*set_params, array(ids)])
            claimed = self.load_claimed(cursor.fetchall())
        claimed.sort(key=lambda r: order[r.id])
        return claimed

    def json_append_sql(self, column: str) -> str:
        return f"{column} || jsonb_build_array(%s::text)"

    def finish_many(
        self, *, owner: str, items: Sequence[tuple[int, int, str | None]]
    ) -> FinishReport:
        rows = self._finish_statement(owner, items, only_simple=False)
        report = FinishReport([Finished(*row) for row in rows])
        self._sort_missing(
            report, {i: a for i, a, _ in items}, {f.job_id for f in report.finished}, owner
        )
        return report

    def finish_simple(
        self, *, owner: str, items: Sequence[tuple[int, int, str | None]]
    ) -> list[Finished]:
        # In autocommit, one statement: only jobs that nothing depends on and that belong to
        # no container, which need nothing else in their transaction. A row locked elsewhere,
        # or whose lease is gone, or that needs the graph to react, is not returned.
        rows = self._finish_statement(owner, items, only_simple=True)
        return [Finished(*row) for row in rows]

    def _finish_statement(
        self, owner: str, items: Sequence[tuple[int, int, str | None]], *, only_simple: bool
    ) -> list[Any]:
        table = self.qn(Job._meta.db_table)
        key = ("finish_sql", table, only_simple)
        if key not in self._sql_cache:
            now, _ = self.compile(DbNow())
            simple = (
                "AND NOT j.has_dependents AND j.parent_id IS NULL AND NOT j.has_children"
                if only_simple
                else ""
            )
            # The batch travels as one JSON document (one C-level json.dumps here, one parse
            # on the server), not as arrays dumped element by element. The rows are locked
            # with SKIP LOCKED first: a row an application transaction holds locked is left
            # for the next batch instead of stalling every other outcome.
            self._sql_cache[key] = (
                f"""
                WITH v AS (
                    SELECT * FROM jsonb_to_recordset(%s::jsonb)
                        AS v(id bigint, attempt int, result jsonb)
                ), locked AS (
                    SELECT j.id, j.attempts, j.cancel_requested FROM {table} AS j
                    WHERE j.id = ANY(%s::bigint[]) AND j.lease_owner = %s
                      AND j.state IN ('leased', 'running') {simple}
                    FOR UPDATE OF j SKIP LOCKED
                )
                UPDATE {table} AS j SET
                    state = CASE WHEN l.cancel_requested THEN 'cancelled' ELSE 'done' END,
                    result = CASE WHEN l.cancel_requested OR jsonb_typeof(v.result) = 'null'
                        THEN NULL ELSE v.result END,
                    lease_owner = NULL, lease_expires = NULL, unique_slot = NULL,
                    finished_at = {now}, updated_at = {now}
                FROM locked AS l JOIN v ON v.id = l.id AND v.attempt = l.attempts
                WHERE j.id = l.id
                RETURNING j.id, j.state, j.parent_id, j.has_dependents, j.has_children
                """,
                [],
            )
        sql, _ = self._sql_cache[key]
        # The results are JSON text already: spliced in as they are (None is JSON null, which
        # the statement stores as SQL NULL, as the ORM stores a None result).
        batch = (
            "["
            + ",".join(
                f'{{"id":{i},"attempt":{a},"result":{"null" if t is None else t}}}'
                for i, a, t in items
            )
            + "]"
        )
        with self.connection.cursor() as cursor:
            cursor.execute(sql, [batch, array([i for i, _, _ in items]), owner])
            return list(cursor.fetchall())

    def suspend_sleeps(self, items: Sequence[tuple[int, str, int, float, list[Any]]]) -> list[int]:
        # A sleep is the commonest suspension and needs nothing but its row and its records:
        # one statement instead of a transaction of five round trips (BEGIN, the locking read,
        # the records' INSERT, the UPDATE, COMMIT). Rows locked elsewhere (SKIP LOCKED), whose
        # lease is gone, or whose cancellation was requested are not returned: the caller
        # takes them through the full transaction, which knows what to do with each.
        table, steps = self.qn(Job._meta.db_table), self.qn(JobStep._meta.db_table)
        key = ("suspend_sleeps_sql", table)
        if key not in self._sql_cache:
            now, _ = self.compile(DbNow())
            states = ", ".join(f"'{state}'" for state in Job.LEASED_STATES)
            self._sql_cache[key] = (
                f"""
                WITH v AS (
                    SELECT * FROM jsonb_to_recordset(%s::jsonb)
                        AS v(id bigint, owner text, attempt int, delay float8, records jsonb)
                ), locked AS (
                    SELECT j.id, j.attempts, j.lease_owner FROM {table} AS j
                    WHERE j.id = ANY(%s::bigint[])
                      AND j.state IN ({states}) AND NOT j.cancel_requested
                    FOR UPDATE OF j SKIP LOCKED
                ), moved AS (
                    UPDATE {table} AS j SET
                        state = 'scheduled', run_after = {now} + make_interval(secs => v.delay),
                        has_steps = TRUE, lease_owner = NULL, lease_expires = NULL,
                        attempts = j.attempts - 1, updated_at = {now}
                    FROM locked AS l JOIN v
                        ON v.id = l.id AND v.attempt = l.attempts AND v.owner = l.lease_owner
                    WHERE j.id = l.id
                    RETURNING j.id, v.attempt, v.records
                ), recorded AS (
                    INSERT INTO {steps}
                        (job_id, name, seq, place, result, attempt, duration, created_at)
                    SELECT m.id, r.name, r.seq, r.place, r.result, m.attempt, NULL, {now}
                    FROM moved AS m
                    CROSS JOIN jsonb_to_recordset(m.records)
                        AS r(name text, seq int, place int, result jsonb)
                )
                SELECT id FROM moved
                """,
                [],
            )
        sql, _ = self._sql_cache[key]
        batch = json.dumps(
            [
                {
                    "id": job_id,
                    "owner": owner,
                    "attempt": attempt,
                    "delay": seconds(delay).total_seconds(),  # clamped as every delay is
                    "records": [
                        {"name": n, "seq": q, "place": p, "result": r} for n, q, r, p in records
                    ],
                }
                for job_id, owner, attempt, delay, records in items
            ]
        )
        with self.connection.cursor() as cursor:
            cursor.execute(sql, [batch, array([item[0] for item in items])])
            return [row[0] for row in cursor.fetchall()]

    def read_records(self, ids: list[int], limit: int) -> list[tuple[Any, ...]]:
        # The ids as one array parameter: with more than 50 parameters psycopg parses the
        # statement's placeholders again at each execution, most of the read's CPU.
        steps = self.qn(JobStep._meta.db_table)
        sql = (
            f"SELECT job_id, name, seq, result, place FROM {steps} "
            "WHERE job_id = ANY(%s::bigint[]) ORDER BY job_id LIMIT %s"
        )
        return self._fetch_records(sql, [array(ids), limit])

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
        if not mark:
            return super().record_call(job_id=job_id, owner=owner, attempt=attempt, name=name,
                                       seq=seq, result=result, duration=duration,
                                       place=place)  # fmt: skip
        # The mark and the insert in one statement (an UPDATE that locks and fences the
        # row, in a CTE): a record is then one statement, even the job's first.
        values = self._record_values(name, seq, place, result, attempt, duration)
        with self.connection.cursor() as cursor:
            cursor.execute(self._mark_and_record_sql, [job_id, owner, attempt, *values])
            return bool(cursor.rowcount)

    @functools.cached_property
    def _mark_and_record_sql(self) -> str:
        step, job = self.qn(JobStep._meta.db_table), self.qn(Job._meta.db_table)
        states = ", ".join(f"'{state}'" for state in Job.LEASED_STATES)
        return (
            f"WITH j AS (UPDATE {job} SET has_steps = true WHERE id = %s AND lease_owner = %s "
            f"AND attempts = %s AND state IN ({states}) RETURNING id) "
            f"INSERT INTO {step} (job_id, name, seq, place, result, attempt, duration, "
            "created_at) SELECT j.id, %s, %s, %s, %s, %s, %s, %s FROM j"
        )

    def record_calls(self, items: Sequence[tuple[Any, ...]]) -> set[int]:
        # One statement for the batch: the rows locked in id order, the jobs' first records
        # marked, the records inserted.
        if not items:
            return set()
        table, steps = self.qn(Job._meta.db_table), self.qn(JobStep._meta.db_table)
        key = ("record_calls_sql", table)
        if key not in self._sql_cache:
            now, _ = self.compile(DbNow())
            states = ", ".join(f"'{state}'" for state in Job.LEASED_STATES)
            self._sql_cache[key] = (
                f"""
                WITH v AS (
                    SELECT * FROM jsonb_to_recordset(%s::jsonb) AS v(id bigint, owner text,
                        attempt int, name text, seq int, place int, result jsonb,
                        duration float8, mark bool)
                ), fenced AS (
                    SELECT j.id FROM {table} AS j JOIN v
                        ON v.id = j.id AND v.owner = j.lease_owner AND v.attempt = j.attempts
                    WHERE j.id = ANY(%s::bigint[]) AND j.state IN ({states})
                    ORDER BY j.id FOR UPDATE OF j
                ), marked AS (
                    UPDATE {table} AS j SET has_steps = TRUE FROM v
                    WHERE j.id = v.id AND v.mark AND j.id IN (SELECT id FROM fenced)
                )
                INSERT INTO {steps}
                    (job_id, name, seq, place, result, attempt, duration, created_at)
                SELECT v.id, v.name, v.seq, v.place, v.result, v.attempt, v.duration, {now}
                FROM v WHERE v.id IN (SELECT id FROM fenced)
                RETURNING job_id
                """,
                [],
            )
        sql, _ = self._sql_cache[key]
        batch = json.dumps(
            [
                {
                    "id": job_id,
                    "owner": owner,
                    "attempt": attempt,
                    "name": name,
                    "seq": seq,
                    "place": place,
                    "result": result,
                    "duration": duration,
                    "mark": mark,
                }
                for job_id, owner, attempt, name, seq, place, result, duration, mark in items
            ]
        )
        with self.connection.cursor() as cursor:
            cursor.execute(sql, [batch, array(sorted(item[0] for item in items))])
            return {row[0] for row in cursor.fetchall()}

    def record_transaction(self) -> Any:
        # A record is one statement here (see record_call): in autocommit it needs no BEGIN
        # and COMMIT trips.
        if self.autocommit_statements and not self.connection.in_atomic_block:
            return nullcontext()
        return super().record_transaction()

    def promote_due(self, batch: int) -> dict[str, int]:
        # The promoter's transaction of four round trips (BEGIN, the locking read, the UPDATE,
        # COMMIT) and its NOTIFYs, as one statement: a stream of short sleeps keeps it busy.
        key = ("promote_due_sql", batch)
        if key not in self._sql_cache:
            due = Job.objects.using(self.using).due().order_by("run_after", "pk").values("pk")
            inner, params = self.compile_locked(due, batch)
            now, _ = self.compile(DbNow())
            table = self.qn(Job._meta.db_table)
            self._sql_cache[key] = (
                f"""
                WITH due (id) AS ({inner}), moved AS (
                    UPDATE {table} AS j SET state = 'ready', updated_at = {now}
                    WHERE j.id = ANY(ARRAY(SELECT id FROM due))
                    RETURNING j.queue
                )
                SELECT queue, COUNT(*), pg_notify(%s, queue) FROM moved GROUP BY queue
                """,
                [*params, CHANNEL],
            )
        sql, params = self._sql_cache[key]
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return {queue: count for queue, count, _ in cursor.fetchall()}

    @property
    def autocommit_statements(self) -> bool:
        # Only at READ COMMITTED (PostgreSQL's default): at a stricter level configured for
        # the project, a claim must run in a transaction that pins READ COMMITTED first.
        return self._read_committed()


class NotificationStream:
    """A LISTEN on the queue channel, on the calling thread's own connection."""

    def __init__(self, dialect: PostgreSQLDialect) -> None:
        self.dialect = dialect
        conn = dialect.connection
        conn.ensure_connection()
        if conn.in_atomic_block or not conn.get_autocommit():
            raise RuntimeError("LISTEN needs a connection in autocommit mode.")
        self.raw: Any = conn.connection
        with conn.cursor() as cursor:
            cursor.execute(f"LISTEN {CHANNEL}")

    def wait(self, timeout: float) -> list[str]:
        """Block up to `timeout` seconds for notifications; return their payloads (queues)."""
        # Raw driver calls: a cut connection raises the driver's error; wrapped, Django's
        # DatabaseError, which the duty takes for an outage (reconnect), not for a bug.
        with self.dialect.connection.wrap_database_errors:
            if hasattr(self.raw, "notifies") and callable(self.raw.notifies):  # psycopg 3
                return [n.payload for n in self.raw.notifies(timeout=timeout, stop_after=1)]
            # psycopg2: wait for the socket, then collect what arrived.
            if select.select([self.raw], [], [], timeout)[0]:
                self.raw.poll()
            payloads = [n.payload for n in self.raw.notifies]
            self.raw.notifies.clear()
            return payloads

    def close(self) -> None:
        self.dialect.connection.close()
