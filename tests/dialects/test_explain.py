"""The claim and reclaim queries use the queue's indexes on every database.

The table is filled the way a long-running queue looks: thousands of finished rows, a few
ready and in-flight ones. After the statistics are refreshed, the planner of each database
must pick `jobqueue_job_ready` for the claim scan (a partial index on PostgreSQL and SQLite,
a composite index led by `state` on MySQL/MariaDB) and `jobqueue_job_lease_expires` for the
expired-lease sweep. The queries are built exactly as leases.claim() and
maintenance.reclaim_expired() build them, including the dialect's row lock.

These tests commit (transaction=True): MySQL's ANALYZE TABLE commits implicitly, and the
statistics should describe committed rows on every database.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_jobqueue.dialects import get_dialect
from django_jobqueue.models import Job
from tests.support.markers import only_sqlite

pytestmark = pytest.mark.django_db(transaction=True)

TABLE = Job._meta.db_table
READY_INDEX = "jobqueue_job_ready"
LEASE_INDEX = "jobqueue_job_lease_expires"
DONE_ROWS = 3000
READY_ROWS = 20


@pytest.fixture
def queue_table() -> None:
    """Fill the table like a busy queue's history, then refresh the planner's statistics."""
    now = timezone.now()
    Job.objects.bulk_create(
        (
            Job(
                type="test.noop",
                state=Job.State.DONE,
                attempts=1,
                finished_at=now - dt.timedelta(seconds=i),
                result=i,
            )
            for i in range(DONE_ROWS)
        ),
        batch_size=500,
    )
    Job.objects.bulk_create(
        Job(type="test.noop", state=Job.State.READY, priority=i % 3) for i in range(READY_ROWS)
    )
    # A few in-flight jobs: most hold a live lease, some have let it expire.
    Job.objects.bulk_create(
        Job(
            type="test.noop",
            state=Job.State.RUNNING if i % 2 else Job.State.LEASED,
            attempts=1,
            lease_owner=f"worker-{i}",
            lease_expires=now + dt.timedelta(minutes=5)
            if i >= 4
            else now - dt.timedelta(minutes=5),
        )
        for i in range(20)
    )
    analyze()


def analyze() -> None:
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(f"ANALYZE TABLE {TABLE}")
            cursor.fetchall()
        else:
            cursor.execute(f"ANALYZE {TABLE}")


def claim_queryset(queues: list[str] | None = None) -> Any:
    """The claim query of leases.claim(), with the dialect's claim lock and a batch of 10."""
    dialect = get_dialect("default")
    candidates = Job.objects.ready().in_queues(queues).order_by("-priority", "pk")
    return dialect.lock(candidates)[:10]


def reclaim_queryset() -> Any:
    """The expired-lease query of maintenance.reclaim_expired()."""
    dialect = get_dialect("default")
    return dialect.lock(Job.objects.expired().order_by("lease_expires", "pk")).values_list(
        "pk", "attempts", "max_attempts", "lease_owner"
    )[:100]


def explain(queryset: Any) -> tuple[set[str], bool]:
    """Return the indexes the database's plan for `queryset` reads, and whether it sorts."""
    # select_for_update() compiles only inside a transaction; the plan is the same.
    with transaction.atomic():
        sql, params = queryset.query.get_compiler(using="default").as_sql()
        used, sorts, _ = explain_sql(sql, params)
    return used, sorts


def _pg_nodes(node: Any) -> Iterator[dict[str, Any]]:
    """Every plan node of an EXPLAIN (FORMAT JSON) document."""
    if isinstance(node, dict):
        if "Node Type" in node:
            yield node
        for value in node.values():
            yield from _pg_nodes(value)
    elif isinstance(node, list):
        for item in node:
            yield from _pg_nodes(item)


def plan_text(queryset: Any) -> str:
    with transaction.atomic():
        return str(queryset.explain())


@pytest.mark.parametrize("queues", [None, ["default", "emails"]], ids=["all-queues", "named"])
def test_claim_query_uses_the_ready_index(queue_table: None, queues: list[str] | None) -> None:
    """The ready index serves both the filter and the ORDER BY: no sort step in the plan."""
    used, sorts = explain(claim_queryset(queues))
    assert READY_INDEX in used, (used, plan_text(claim_queryset(queues)))
    assert not sorts, plan_text(claim_queryset(queues))


def test_claim_query_returns_ready_rows_by_priority(queue_table: None) -> None:
    with transaction.atomic():
        rows = list(claim_queryset())
    assert len(rows) == 10
    assert all(r.state == Job.State.READY for r in rows)
    keys = [(-r.priority, r.pk) for r in rows]
    assert keys == sorted(keys)
    assert rows[0].priority == 2


def test_expired_lease_query_uses_the_lease_index(queue_table: None) -> None:
    used, _ = explain(reclaim_queryset())
    assert LEASE_INDEX in used, (used, plan_text(reclaim_queryset()))


def test_expired_lease_query_finds_only_expired_leases(queue_table: None) -> None:
    with transaction.atomic():
        rows = list(reclaim_queryset())
    assert len(rows) == 4
    assert {owner for *_, owner in rows} == {f"worker-{i}" for i in range(4)}


def _index_columns_mysql() -> list[tuple[int, str, str | None]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT SEQ_IN_INDEX, COLUMN_NAME, COLLATION FROM information_schema.STATISTICS "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s AND INDEX_NAME = %s "
            "ORDER BY SEQ_IN_INDEX",
            [TABLE, READY_INDEX],
        )
        return [(int(seq), str(col), coll) for seq, col, coll in cursor.fetchall()]


def test_ready_index_shape_in_the_catalog() -> None:
    """Partial (WHERE state = 'ready') on PostgreSQL and SQLite; led by `state` on MySQL.

    The test database went through every migration: on SQLite, later migrations that rebuild
    the table must have recreated the index (it is part of the migration state for that).
    """
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT indexdef FROM pg_indexes WHERE tablename = %s AND indexname = %s",
                [TABLE, READY_INDEX],
            )
            row = cursor.fetchone()
            assert row is not None, f"index {READY_INDEX} is missing"
            (definition,) = row
            assert re.search(r"WHERE \(+\(?state\)?(::text)? = 'ready'", definition), definition
            assert "priority DESC" in definition, definition
        elif connection.vendor == "sqlite":
            cursor.execute(
                "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = %s", [READY_INDEX]
            )
            row = cursor.fetchone()
            assert row is not None, f"index {READY_INDEX} is missing"
            (definition,) = row
            assert re.search(r"WHERE\s+\"?state\"?\s*=\s*'ready'", definition), definition
            assert re.search(r"\"?priority\"? DESC", definition), definition
        else:
            columns = _index_columns_mysql()
            assert [c for _, c, _ in columns] == ["state", "priority", "id"], columns
            # MariaDB 10.8+ and MySQL 8 keep DESC: COLLATION 'D' for a descending column.
            assert columns[1][2] == "D", columns


def test_lease_index_exists_in_the_catalog() -> None:
    constraints = connection.introspection.get_constraints(connection.cursor(), TABLE)
    assert constraints[LEASE_INDEX]["index"] is True
    assert constraints[LEASE_INDEX]["columns"] == ["lease_expires"]
    assert READY_INDEX in constraints


@only_sqlite("only SQLite rebuilds a table to alter it")
def test_sqlite_table_rebuild_keeps_the_ready_index() -> None:
    """SQLite alters a column by rebuilding the table with the indexes the model declares."""
    old = Job._meta.get_field("type")
    wider = old.clone()
    wider.set_attributes_from_name("type")
    wider.max_length = old.max_length + 1  # type: ignore[operator]
    with connection.schema_editor() as editor:
        editor.alter_field(Job, old, wider)
        editor.alter_field(Job, wider, old)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = %s", [READY_INDEX]
        )
        row = cursor.fetchone()
    assert row is not None, "the table rebuild dropped the ready index"
    assert re.search(r"WHERE\s+\"?state\"?\s*=\s*'ready'", row[0]), row[0]


# -- the engine's own statements, as the worker runs them --------------------------------------

SCHEDULED_INDEX = "jobqueue_job_scheduled"
GROUP_INDEX = "jobqueue_job_ready_group"


@pytest.fixture
def busy_table(queue_table: None) -> None:
    """The queue's history plus many scheduled jobs (retries in backoff, jobs for later) and
    ready jobs in several groups."""
    now = timezone.now()
    Job.objects.bulk_create(
        (
            Job(
                type="test.noop",
                state=Job.State.SCHEDULED,
                run_after=now + dt.timedelta(minutes=10, seconds=i),
            )
            for i in range(2000)
        ),
        batch_size=500,
    )
    Job.objects.bulk_create(
        Job(type="test.noop", state=Job.State.READY, group_key=f"g{i % 4}") for i in range(40)
    )
    analyze()


def statements_of(action: Any) -> list[str]:
    """The SQL statements `action()` sends on this connection (parameters inlined)."""
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        action()
    statements = []
    for query in captured.captured_queries:
        sql = query["sql"]
        # A worker's transaction on PostgreSQL sends its BEGIN and its lock bounds with its
        # first statement, as one query (dialects/postgresql.py, transaction_waits).
        if sql.startswith("BEGIN; "):
            statements.append("BEGIN")
            sql = sql.removeprefix("BEGIN; ")
        if sql.startswith("SELECT set_config(") and "; " in sql:
            statements += sql.split("; ", 1)
        else:
            statements.append(sql)
    return statements


def explain_sql(sql: str, params: Any = None) -> tuple[set[str], bool, str]:
    """Return the indexes a statement's plan reads, whether it sorts, and the plan's text."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
            plan = cursor.fetchone()[0]
            plan = json.loads(plan) if isinstance(plan, str) else plan
            nodes = list(_pg_nodes(plan))
            return (
                {n["Index Name"] for n in nodes if "Index Name" in n},
                any(n.get("Node Type") in ("Sort", "Incremental Sort") for n in nodes),
                json.dumps(plan)[:3000],
            )
        if connection.vendor == "mysql":
            cursor.execute(f"EXPLAIN {sql}", params)
            columns = [c[0].lower() for c in cursor.description]
            rows = [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
            return (
                {row["key"] for row in rows if row["key"]},
                any("filesort" in (row["extra"] or "") for row in rows),
                str(rows),
            )
        cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params)
        details = " ".join(str(row[-1]) for row in cursor.fetchall())
        return (
            set(re.findall(r"USING (?:COVERING )?INDEX (\w+)", details)),
            "TEMP B-TREE" in details,
            details,
        )


def job_statements(statements: list[str], *starts: str) -> list[str]:
    """The statements of `statements` that read the job table (not another table whose name
    begins with its name, such as the job steps' or waits')."""
    table = re.compile(rf"\b{re.escape(TABLE.lower())}\b(?!_)")
    return [
        s
        for s in statements
        if table.search(s.lower())
        and s.lstrip().upper().startswith(starts or ("SELECT", "UPDATE", "WITH"))
    ]


def test_the_claim_reads_only_the_ready_index(busy_table: None) -> None:
    """The claim the dispatcher runs (one UPDATE ... RETURNING on PostgreSQL and SQLite, a
    locking SELECT then an UPDATE by ids on MySQL) reads the ready index, in its order: the
    finished and scheduled rows cost it nothing."""
    from django_jobqueue.engine import leases

    dialect = get_dialect("default")
    statements = statements_of(
        lambda: leases.claim(dialect, owner="explain", queues=[], limit=10, lease_ttl=30)
    )
    claim = job_statements(statements)
    assert claim, statements
    used, sorts, plan = explain_sql(claim[0])
    assert READY_INDEX in used, plan
    assert not sorts, plan
    assert SCHEDULED_INDEX not in used and GROUP_INDEX not in used, plan


def test_the_promoter_reads_only_the_scheduled_index(busy_table: None) -> None:
    from django_jobqueue.engine.staging import promote_due
    from django_jobqueue.worker.promoter import seconds_until_due

    dialect = get_dialect("default")
    Job.objects.filter(
        state=Job.State.SCHEDULED,
        run_after__lt=timezone.now() + dt.timedelta(minutes=10, seconds=5),
    ).update(run_after=timezone.now() - dt.timedelta(seconds=1))
    analyze()
    statements = statements_of(lambda: promote_due(dialect, batch=100))
    # One statement on PostgreSQL (WITH the due rows, UPDATE them), else a locking SELECT.
    [due] = job_statements(statements, "SELECT", "WITH")
    used, sorts, plan = explain_sql(due)
    assert SCHEDULED_INDEX in used, plan
    assert not sorts, plan
    statements = statements_of(lambda: seconds_until_due(dialect))
    [nxt] = job_statements(statements, "SELECT")
    used, sorts, plan = explain_sql(nxt)
    assert SCHEDULED_INDEX in used, plan
    assert not sorts, plan


def test_the_fair_share_claim_reads_the_group_index(busy_table: None) -> None:
    """With several groups, each group's best ready jobs come from the group index."""
    from django_jobqueue import conf
    from django_jobqueue.engine.fair_selection import FairShare

    fair_share = FairShare(conf.get())
    per_group = group_reads(fair_share)
    used, _, plan = explain_sql(per_group[0])
    assert GROUP_INDEX in used, plan


def group_reads(fair_share: Any, group: str = "") -> list[str]:
    """The statements of a fair-share claim of 8 that read the ready jobs of one group
    (`group`, or any): not the demand view, a GROUP BY."""
    from django_jobqueue.engine import leases

    dialect = get_dialect("default")
    statements = statements_of(
        lambda: leases.claim(
            dialect, owner="explain", queues=[], limit=8, lease_ttl=30, fair_share=fair_share
        )
    )
    one = rf"group_key[\"`]? = '?{re.escape(group)}" if group else r"group_key[\"`]? = "
    # PostgreSQL reads the planned groups in one LATERAL statement, the groups an array;
    # SQLite in one statement over a JSON document of them.
    lateral = r"group_key[\"`]? = \(?(jq_r\.name|json_extract\(jq_r\.value)"
    reads = [
        sql
        for sql in job_statements(statements, "SELECT")
        if (re.search(one, sql) or (re.search(lateral, sql) and (not group or f'"{group}"' in sql)))
        and "GROUP BY" not in sql.upper()
    ]
    assert reads, statements
    return reads


# Another group's backlog ahead of a group's jobs. At this size MariaDB's optimizer still
# picks the group index by itself; in bench/limits_claim.py's interleaved claims (20,000 jobs
# of another queue and group ahead) it did not, and the hint (MySQLDialect.hinted_sql)
# took those claims from 24 ms to 0.4 ms: this holds the hint's plan, it did not fail before.
BACKLOG = 3000


@pytest.mark.parametrize("limits", [False, True], ids=["fair-share", "limits"])
def test_a_group_behind_another_groups_backlog_is_read_from_the_group_index(limits: bool) -> None:
    """A group whose ready jobs all come after another group's backlog (in claim order) is
    read from the group index: MariaDB's optimizer took the ready index, in the same order,
    and read the other group's whole backlog at every claim (24 ms instead of 0.4 ms behind
    20,000 jobs)."""
    from django.test import override_settings

    from django_jobqueue import conf
    from django_jobqueue.engine.fair_selection import FairShare

    settings = {"LIMITS": {"tenant:*": {"concurrency": 1}}} if limits else {"GROUP_LIMITS": {}}
    uses = (lambda n: {f"tenant:{n}": 1}) if limits else (lambda n: None)
    Job.objects.bulk_create(
        (Job(type="test.noop", state=Job.State.READY, group_key="a", uses=uses(n))
         for n in range(BACKLOG)),
        batch_size=500,
    )  # fmt: skip
    Job.objects.bulk_create(
        Job(type="test.noop", state=Job.State.READY, group_key="b", uses=uses(n)) for n in range(20)
    )
    analyze()
    with override_settings(JOBQUEUE=settings):
        behind = group_reads(FairShare(conf.get()), "b")
    used, sorts, plan = explain_sql(behind[0])
    assert used == {GROUP_INDEX}, plan
    assert not sorts, plan


QUEUE_INDEX = "jobqueue_job_ready_queue"


def test_a_queue_behind_another_queues_backlog_is_read_from_the_queue_index_under_limits() -> None:
    """The same under LIMITS, where the claim reads the candidates of each group: a group
    that spans both queues must not be read through the ready index either (on MySQL and
    MariaDB the group's read names its indexes: the queue's must stay among them)."""
    from django.test import override_settings

    from django_jobqueue import conf
    from django_jobqueue.engine import leases
    from django_jobqueue.engine.fair_selection import FairShare

    Job.objects.bulk_create(
        (Job(type="test.noop", state=Job.State.READY, queue="a", uses={f"tenant:{n}": 1})
         for n in range(BACKLOG)),
        batch_size=500,
    )  # fmt: skip
    Job.objects.bulk_create(
        Job(type="test.noop", state=Job.State.READY, queue="b", uses={f"tenant:{n}": 1})
        for n in range(20)
    )
    analyze()
    dialect = get_dialect("default")
    claimed: list[Any] = []
    with override_settings(JOBQUEUE={"LIMITS": {"tenant:*": {"concurrency": 1}}}):
        fair_share = FairShare(conf.get())
        statements = statements_of(
            lambda: claimed.extend(
                leases.claim(
                    dialect, owner="explain", queues=["b"], limit=10, lease_ttl=30,
                    fair_share=fair_share,
                )
            )
        )  # fmt: skip
    assert {job.queue for job in claimed} == {"b"} and claimed
    reads = [s for s in job_statements(statements, "SELECT") if "GROUP BY" not in s.upper()]
    reads = [s for s in reads if re.search(r"group_key[\"`]? = ", s)]
    assert reads, statements
    used, _, plan = explain_sql(reads[0])
    assert READY_INDEX not in used and GROUP_INDEX not in used, plan


def test_a_queue_behind_another_queues_backlog_is_read_from_the_queue_index() -> None:
    """A worker that serves one queue reads that queue's ready jobs from the queue's index:
    through the ready index it read every other queue's ready jobs ahead of its own at each
    claim (4.9 ms instead of 1.2 ms behind 20,000 jobs on PostgreSQL, 30.5 against 3.6 on
    MariaDB)."""
    from django_jobqueue.engine import leases

    Job.objects.bulk_create(
        (Job(type="test.noop", state=Job.State.READY, queue="a") for n in range(BACKLOG)),
        batch_size=500,
    )
    Job.objects.bulk_create(
        Job(type="test.noop", state=Job.State.READY, queue="b") for n in range(20)
    )
    analyze()
    dialect = get_dialect("default")
    claimed: list[Any] = []
    statements = statements_of(
        lambda: claimed.extend(
            leases.claim(dialect, owner="explain", queues=["b"], limit=10, lease_ttl=30)
        )
    )
    assert {job.queue for job in claimed} == {"b"} and len(claimed) == 10
    claim = job_statements(statements)
    assert claim, statements
    used, sorts, plan = explain_sql(claim[0])
    assert QUEUE_INDEX in used and READY_INDEX not in used, plan
    assert not sorts, plan


def test_several_queues_behind_another_queues_backlog_are_read_from_their_indexes() -> None:
    """A worker that serves a few queues reads each one's ready jobs from the queue's index
    and merges them: through the ready index it read every other queue's ready jobs ahead
    of its own (4.3-4.7 ms instead of 1.4 behind 20,000 jobs on PostgreSQL, 28 against 3.7
    on MariaDB). The merge keeps the claim order across the queues."""
    from django_jobqueue.engine import leases

    Job.objects.bulk_create(
        (Job(type="test.noop", state=Job.State.READY, queue="a") for n in range(BACKLOG)),
        batch_size=500,
    )
    Job.objects.bulk_create(
        Job(type="test.noop", state=Job.State.READY, queue=queue, priority=n % 3)
        for n in range(24)
        for queue in ("b", "c")
    )
    analyze()
    best = list(
        Job.objects.filter(queue__in=["b", "c"])
        .order_by("-priority", "pk")
        .values_list("pk", flat=True)[:10]
    )
    dialect = get_dialect("default")
    claimed: list[Any] = []
    statements = statements_of(
        lambda: claimed.extend(
            leases.claim(dialect, owner="explain", queues=["b", "c"], limit=10, lease_ttl=30)
        )
    )
    assert [job.pk for job in claimed] == best  # the claim order across both queues
    assert {job.queue for job in claimed} == {"b", "c"}
    claim = job_statements(statements)
    assert claim, statements
    used, _, plan = explain_sql(claim[0])
    assert QUEUE_INDEX in used and READY_INDEX not in used, plan


def test_whether_several_groups_are_ready_is_two_seeks_in_the_group_index(busy_table: None) -> None:
    """Without limits, the claim asks only whether a second group has ready work: two reads
    of the group index, each stopping at its first row, never a read of every ready row."""
    from django_jobqueue import conf
    from django_jobqueue.engine import leases
    from django_jobqueue.engine.fair_selection import FairShare

    fair_share = FairShare(conf.get())
    assert not fair_share.has_limits
    statements = statements_of(
        lambda: fair_share.needs_planning(leases._ready("default", (), (("test.noop", ("",)),), ()))
    )
    reads = job_statements(statements, "SELECT")
    assert len(reads) == 2, statements
    for sql in reads:
        assert "GROUP BY" not in sql.upper()
        assert re.search(r"LIMIT 1\b", sql), sql
        used, sorts, plan = explain_sql(sql)
        assert GROUP_INDEX in used and not sorts, plan
    assert (
        fair_share.needs_planning(leases._ready("default", (), (("test.noop", ("",)),), ())) is True
    )


# -- plans that hold whatever the statistics say ------------------------------------------------


# A queue with a backlog: big enough that reading the whole table (or every ready row) costs
# the planner far more than the index does, whatever the statistics say of selectivity.
BACKLOG_DONE = 40_960
BACKLOG_SCHEDULED = 2_048
BACKLOG_READY = 20_480
DOUBLINGS = 5


def fill_backlog() -> None:
    """History, scheduled jobs, and a backlog of ready jobs in several groups.

    A thousand of each kind are made by the ORM, then doubled by INSERT ... SELECT of the
    table into itself (the same SQL on every database, and seconds instead of minutes).
    """
    now = timezone.now()
    Job.objects.bulk_create(
        [
            Job(type="test.noop", state=Job.State.DONE, attempts=1, result=i,
                finished_at=now - dt.timedelta(seconds=i))
            for i in range(BACKLOG_DONE // 2**DOUBLINGS)
        ]
        + [
            Job(type="test.noop", state=Job.State.SCHEDULED,
                run_after=now + dt.timedelta(minutes=10, seconds=i))
            for i in range(BACKLOG_SCHEDULED // 2**DOUBLINGS)
        ]
        + [
            Job(type="test.noop", state=Job.State.READY, group_key=f"g{i % 4}", priority=i % 3)
            for i in range(BACKLOG_READY // 2**DOUBLINGS)
        ],
        batch_size=1000,
    )  # fmt: skip
    qn = connection.ops.quote_name
    columns = ", ".join(qn(f.column) for f in Job._meta.concrete_fields if not f.primary_key)
    with connection.cursor() as cursor:
        for _ in range(DOUBLINGS):
            cursor.execute(f"INSERT INTO {qn(TABLE)} ({columns}) SELECT {columns} FROM {qn(TABLE)}")


@pytest.fixture(params=["analyzed-full", "analyzed-empty"])
def statistics(request: pytest.FixtureRequest) -> str:
    """A queue with a backlog, its statistics either fresh or taken while the table was empty
    (a fresh deployment, or a server whose autovacuum is off or lags)."""
    if request.param == "analyzed-empty":
        analyze()
        fill_backlog()
    else:
        fill_backlog()
        analyze()
    return str(request.param)


def _reads_a_range(node: dict[str, Any]) -> bool:
    """Whether a PostgreSQL plan node reads the job table beyond the rows it looks up: a
    sequential scan, or a bitmap scan over anything but primary-key lookups (the planner takes
    a bitmap of primary-key lookups over an index scan as the statistics go, for instance once
    autovacuum analyzed the table in the middle of a test: it reads only those rows)."""
    if node.get("Relation Name") != TABLE:
        return False
    if node["Node Type"] == "Bitmap Heap Scan":
        return not re.match(r"\(id = ", node.get("Recheck Cond", ""))
    return node["Node Type"] == "Seq Scan"


def full_scans(sql: str) -> tuple[bool, str]:
    """Whether the plan of `sql` reads the whole job table (or all of an index), and the plan
    in short: one line per node."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}")
            plan = cursor.fetchone()[0]
            nodes = list(_pg_nodes(json.loads(plan) if isinstance(plan, str) else plan))
            text = "\n".join(
                f"{n['Node Type']} {n.get('Relation Name', '')} {n.get('Index Name', '')} "
                f"{n.get('Index Cond', '')} {n.get('Recheck Cond', '')}"
                for n in nodes
            )
            return any(_reads_a_range(n) for n in nodes), text
        if connection.vendor == "mysql":
            cursor.execute(f"EXPLAIN {sql}")
            columns = [c[0].lower() for c in cursor.description]
            rows = [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
            text = "\n".join(f"{r['table']} {r['type']} {r['key']} {r['extra']}" for r in rows)
            return any(r["table"] in (TABLE, "j") and r["type"] in ("ALL", "index")
                       for r in rows), text  # fmt: skip
        cursor.execute(f"EXPLAIN QUERY PLAN {sql}")
        text = "\n".join(str(row[-1]) for row in cursor.fetchall())
        return bool(re.search(rf"SCAN ({TABLE}|j)\b(?! USING)", text)), text


def claimed_leases(dialect: Any, limit: int = 20) -> list[Any]:
    from django_jobqueue.engine import leases

    jobs = leases.claim(dialect, owner="explain", queues=[], limit=limit, lease_ttl=30)
    assert len(jobs) == limit
    return [leases.Lease(job.id, "explain", job.attempts) for job in jobs]


def test_the_claim_plan_holds_whatever_the_statistics(statistics: str) -> None:
    from django_jobqueue.engine import leases

    dialect = get_dialect("default")
    statements = statements_of(
        lambda: leases.claim(dialect, owner="explain", queues=[], limit=10, lease_ttl=30)
    )
    [claim, *_] = job_statements(statements)
    used, sorts, plan = explain_sql(claim)
    assert READY_INDEX in used, plan
    assert not sorts, plan


def test_the_finish_plan_holds_whatever_the_statistics(statistics: str) -> None:
    """The batched finish finds its rows by primary key: never a read of every row that has
    no parent or no dependents (the whole table, in a queue without workflows)."""
    from django_jobqueue.engine import leases

    dialect = get_dialect("default")
    held = claimed_leases(dialect)
    items = [(lease.job_id, lease.attempt, None) for lease in held]
    statements = statements_of(lambda: leases.finish_many(dialect, "explain", items))
    writes = job_statements(statements)
    assert writes, statements
    for sql in writes:
        scans, plan = full_scans(sql)
        assert not scans, f"{sql[:400]}\n{plan}"
    assert Job.objects.filter(pk__in=[lease.job_id for lease in held], state="done").count() == 20


def test_a_batch_of_sleeps_finds_its_rows_by_primary_key(queue_table: None) -> None:
    """A batch of durable sleeps reads its rows by primary key: a suspension's cost never
    grows with the table. (Joined to the batch's JSON, of which the planner knows nothing,
    the lease filter alone once made PostgreSQL read the whole table of a few thousand rows.)"""
    from django_jobqueue.engine.suspensions import suspend_many
    from django_jobqueue.exceptions import Suspend

    dialect = get_dialect("default")
    held = claimed_leases(dialect)
    items = [
        (lease, Suspend("sleep", delay=60.0, records=[("@sleep", 1, {"seconds": 60}, 1)]))
        for lease in held
    ]
    statements = statements_of(lambda: suspend_many(dialect, items))
    writes = job_statements(statements)
    assert writes, statements
    for sql in writes:
        scans, plan = full_scans(sql)
        assert not scans, f"{sql[:400]}\n{plan}"
    ids = [lease.job_id for lease in held]
    assert Job.objects.filter(pk__in=ids, state="scheduled").count() == 20


def test_full_batches_find_their_rows_by_primary_key(queue_table: None) -> None:
    """A claim of 100 jobs, the finish of 50 and the sleeps of 50 of them, and a promotion of
    100 due jobs find the rows they mark by primary key: their cost never grows with the
    table. (PostgreSQL joined the rows a claim had locked to the table it marks them in by a
    hash join over a read of the whole table, once a batch came to about a hundredth of the
    table: each claim of a drain of 10,000 jobs read all of them.)"""
    from django_jobqueue.engine import leases
    from django_jobqueue.engine.staging import promote_due
    from django_jobqueue.engine.suspensions import suspend_many
    from django_jobqueue.exceptions import Suspend

    dialect = get_dialect("default")
    Job.objects.bulk_create(Job(type="test.noop", state=Job.State.READY) for _ in range(300))
    due = timezone.now() - dt.timedelta(seconds=1)
    Job.objects.bulk_create(
        Job(type="test.noop", state=Job.State.SCHEDULED, run_after=due) for _ in range(300)
    )
    analyze()

    def scan_free(action: Any) -> Any:
        outcome: list[Any] = []
        statements = job_statements(statements_of(lambda: outcome.append(action())))
        assert statements
        for sql in statements:
            scans, plan = full_scans(sql)
            assert not scans, f"{sql[:400]}\n{plan}"
        return outcome[0]

    claimed = scan_free(
        lambda: leases.claim(dialect, owner="explain", queues=[], limit=100, lease_ttl=30)
    )
    assert len(claimed) == 100
    finishing, sleeping = claimed[:50], claimed[50:]
    scan_free(
        lambda: leases.finish_many(
            dialect, "explain", [(j.id, j.attempts, None) for j in finishing]
        )
    )
    sleep = Suspend("sleep", delay=60.0, records=[("@sleep", 1, {"seconds": 60}, 1)])
    leases_ = [leases.Lease(j.id, "explain", j.attempts) for j in sleeping]
    scan_free(lambda: suspend_many(dialect, [(lease, sleep) for lease in leases_]))
    assert scan_free(lambda: promote_due(dialect, batch=100)) == 100
    assert Job.objects.filter(pk__in=[j.id for j in finishing], state="done").count() == 50
    assert Job.objects.filter(pk__in=[j.id for j in sleeping], state="scheduled").count() == 50


def test_the_renewal_plan_holds_whatever_the_statistics(statistics: str) -> None:
    from django_jobqueue.engine import leases

    dialect = get_dialect("default")
    held = claimed_leases(dialect)
    statements = statements_of(lambda: leases.renew_leases(dialect, held, 30))
    reads = job_statements(statements)
    assert reads, statements
    for sql in reads:
        scans, plan = full_scans(sql)
        assert not scans, f"{sql[:400]}\n{plan}"


def test_the_reference_plans_hold_whatever_the_statistics(statistics: str) -> None:
    """A container's children and the jobs a failure cancelled are found through the
    references' own indexes. Both columns are NULL in nearly every row (in every row of the
    backlog the statistics were taken of): analyzed so, SQLite took a plain index on them for
    one value shared by every row, and retrying a job (which revives what it cancelled) read
    all of a million-row table."""
    container = Job.objects.create(type="test.noop", state=Job.State.RUNNING,
                                   lease_owner="w", lease_expires=timezone.now())  # fmt: skip
    Job.objects.bulk_create(
        Job(type="test.noop", parent=container, state=Job.State.CANCELLED,
            cancelled_by=container, finished_at=timezone.now(), unique_slot=None)
        for _ in range(5)
    )  # fmt: skip
    # And cancelled jobs of other causes, so that the state alone is the worse way in.
    Job.objects.bulk_create(
        Job(type="test.noop", state=Job.State.CANCELLED, finished_at=timezone.now(),
            unique_slot=None)
        for _ in range(500)
    )  # fmt: skip
    queries = [
        (Job.objects.filter(cancelled_by_id=container.pk, state=Job.State.CANCELLED),
         "jobqueue_job_cancelled_by"),
        (Job.objects.filter(parent_id=container.pk, state=Job.State.CANCELLED),
         "jobqueue_job_parent"),
        (Job.objects.filter(parent_id=container.pk).exclude(state__in=Job.TERMINAL_STATES),
         "jobqueue_job_parent"),
    ]  # fmt: skip
    for queryset, index in queries:
        sql, params = queryset.values_list("pk").query.sql_with_params()
        used, _, plan = explain_sql(sql, params)
        # MariaDB names an access and its rowid filter together: "index|filter index".
        assert index in {name for key in used for name in key.split("|")}, f"{sql}\n{plan}"
        assert len(queryset) in (0, 5)


def test_full_scans_sees_a_read_of_the_whole_table() -> None:
    """The check above can fail: a filter on a column no index leads reads every row."""
    fill_backlog()
    analyze()
    scans, plan = full_scans(
        f"SELECT id FROM {connection.ops.quote_name(TABLE)} WHERE attempts = 7"
    )
    assert scans, plan
    scans, plan = full_scans(f"SELECT id FROM {connection.ops.quote_name(TABLE)} WHERE id = 7")
    assert not scans, plan
