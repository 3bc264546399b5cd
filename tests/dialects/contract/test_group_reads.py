"""The dialect contract: the SQL building blocks (array literals, the statements kept) and
the reads of the ready groups that fair share plans from."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from django_jobqueue.dialects import get_dialect
from django_jobqueue.dialects.sql import StatementCache
from django_jobqueue.models import Job
from tests.conftest import in_new_thread
from tests.support.dialect_contract import close_connections, ready_jobs
from tests.support.factories import JobFactory

# Claims and finishes commit (and one test uses a second connection): no wrapping transaction.
pytestmark = pytest.mark.django_db(transaction=True)


def test_an_array_literal_reads_back_as_its_values_and_refuses_other_types(dialect):
    from django_jobqueue.models.literals import array

    values = ['a"b', "c\\d", "x,y", "{z}", " s ", "NULL", "", "it's", "ü€"]
    if dialect.vendor == "postgresql":
        with dialect.connection.cursor() as cursor:
            cursor.execute("SELECT %s::text[], %s::bigint[]", [array(values), array([1, 2**62])])
            assert cursor.fetchone() == (values, [1, 2**62])
    # None would read back as the text "None"; a float or a bool is never an id or a key.
    for bad in (None, True, 5.0):
        with pytest.raises(TypeError):
            array(["a", bad])


def test_a_read_of_several_groups_locks_each_groups_best_jobs_and_skips_locked_ones(dialect):
    """`group_reads_sql`: one statement reads, for each (group, count), that group's best
    ready jobs (priority, then age) up to its count, each row numbered by its read, locked
    with SKIP LOCKED (a row another transaction holds is passed over, not waited for); one
    read's rows come without the number. (SQLite has no row locks: its writers take turns on
    the whole database, and nothing is held while it reads.)"""
    locks = dialect.has_select_for_update_skip_locked
    jobs = {
        group: [JobFactory(group_key=group, priority=p).pk for p in priorities]
        for group, priorities in {"a": (0, 5, 5, 1), "b": (0, 0), "c": (2,)}.items()
    }
    best_of_a = jobs["a"][1]  # the older of its two jobs of priority 5
    query = ready_jobs().order_by("-priority", "pk").values_list("pk", "group_key", "priority")
    held, let_go = threading.Event(), threading.Event()

    def hold() -> None:
        def txn() -> None:
            list(Job.objects.select_for_update().filter(pk=best_of_a).values_list("pk"))
            held.set()
            let_go.wait(60)

        get_dialect("default").run_in_transaction(txn)

    def read(reads: list[tuple[str, int]]) -> list[tuple[Any, ...]]:
        def txn() -> list[tuple[Any, ...]]:
            found = []
            for sql, params in dialect.group_reads_sql(query, reads, [], {}):
                with dialect.cursor() as cursor:
                    cursor.execute(sql, params)
                    found += [tuple(row) for row in cursor.fetchall()]
            return found

        return in_new_thread(lambda: dialect.run_in_transaction(txn))

    holder = threading.Thread(target=lambda: (hold(), close_connections()))
    if locks:
        holder.start()
    try:
        assert not locks or held.wait(60)
        rows = read([("a", 2), ("b", 5), ("c", 1)])
        alone = read([("b", 1)])
    finally:
        let_go.set()
        if locks:
            holder.join(60)
    by_read: dict[int, list[int]] = {}
    # Within a read the rows come in any order, and a dialect may return up to the largest
    # count of the reads: the caller keeps each read's first `count` in claim order.
    for n, pk, group, _ in sorted(rows, key=lambda row: (row[0], -row[3], row[1])):
        assert group == "abc"[n]
        if len(by_read.setdefault(n, [])) < (2, 5, 1)[n]:
            by_read[n].append(pk)
    assert {n: sorted(pks) for n, pks in by_read.items()} == {
        # the best but the locked one (where rows are locked)
        0: sorted(jobs["a"][2:] if locks else [best_of_a, jobs["a"][2]]),
        1: sorted(jobs["b"]),
        2: jobs["c"],
    }
    assert alone == [(jobs["b"][0], "b", 0)]


def test_reads_of_many_groups_are_split_within_the_databases_limit_of_parameters(
    dialect, monkeypatch
):
    """The portable `group_reads_sql` (a UNION ALL, each read repeating the ready filter's
    parameters) splits its reads into statements that each stay within the database's
    limit of parameters (SQLite's may be 999): every read still gets its rows."""
    from django.db import connection

    groups = [f"g{n}" for n in range(12)]
    expected = {group: JobFactory(group_key=group).pk for group in groups}
    query = ready_jobs().order_by("-priority", "pk").values_list("pk", "group_key")
    reads = [(group, 1) for group in groups]

    # The portable UNION ALL, not a dialect's own merged form (PostgreSQL's, SQLite's).
    monkeypatch.setattr(dialect, "merged_group_reads_sql", lambda *args: None)

    def statements() -> list[tuple[str, list[Any]]]:
        return dialect.run_in_transaction(lambda: dialect.group_reads_sql(query, reads, [], {}))

    per_read = len(statements()[0][1]) // len(groups)  # each read's parameters
    # A property on the class: it wins over a value cached on the instance (PostgreSQL's).
    limit = property(lambda features: per_read * 5)
    monkeypatch.setattr(type(connection.features), "max_query_params", limit)
    split = statements()
    assert [len(params) // per_read for _, params in split] == [5, 5, 2]

    def run() -> dict[str, int]:
        found = {}
        for sql, params in split:
            with dialect.cursor() as cursor:
                cursor.execute(sql, params)
                for n, pk, group in cursor.fetchall():
                    assert groups[n] == group
                    found[group] = pk
        return found

    assert dialect.run_in_transaction(run) == expected


def test_no_reads_of_groups_is_no_statement(dialect):
    """`group_reads_sql` of no reads (a claim that planned nothing) gives no statement."""
    query = ready_jobs().order_by("-priority", "pk").values_list("pk", "group_key")
    assert dialect.run_in_transaction(lambda: dialect.group_reads_sql(query, [], [], {})) == []


def test_the_compiled_statements_a_dialect_keeps_are_bounded():
    """A key that takes ever new values (what is paused) never grows the cache past its
    limit: it starts over, and the statement just stored is there."""
    cache = StatementCache(limit=3)
    for shape in range(10):
        cache[("claim", shape)] = (f"SELECT {shape}", [])
        assert cache[("claim", shape)] == (f"SELECT {shape}", [])
        assert len(cache) <= 3
    cache[("claim", 9)] = ("SELECT 9", [])  # a shape it holds: nothing is dropped
    assert len(cache) == 1  # emptied at shapes 3, 6 and 9
    assert isinstance(get_dialect("default")._sql_cache, StatementCache)
