"""Search inside a job's arguments from the jobs list (issue 51): `args.tenant_id=42`, nested
keys, strings and numbers, on every database; bad syntax says why, never a 500."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from django_jobqueue.admin import argsearch
from django_jobqueue.models import Job
from tests.support.admin_support import url
from tests.support.factories import JobFactory

pytestmark = pytest.mark.django_db


def found(client: Client, term: str) -> set[int]:
    response = client.get(url("job_changelist"), {"q": term})
    assert response.status_code == 200
    return {job.pk for job in response.context["cl"].result_list}


@pytest.fixture
def jobs() -> dict[str, Job]:
    made = {
        "t42": {"tenant_id": 42, "user": {"name": "Ann Lee", "id": 7}, "flag": True},
        "t42s": {"tenant_id": "42", "user": {"name": "Bob"}, "flag": False},
        "t7": {"tenant_id": 7, "user": {"name": "Ann Lee", "id": "7"}, "note": None},
        "odd": {"contains": "x", "items": ["a", "b"], "price": 2.5, "my-key": "y"},
        "plain": {},
    }
    return {name: JobFactory(args=args) for name, args in made.items()}


@pytest.mark.parametrize(
    ("term", "expected"),
    [
        ("args.tenant_id=42", {"t42", "t42s"}),  # the number, or the digits as a string
        ('args.tenant_id="42"', {"t42", "t42s"}),  # alike on every database
        ("args.tenant_id=7", {"t7"}),
        ("args.user.name=Bob", {"t42s"}),
        ('args.user.name="Ann Lee"', {"t42", "t7"}),
        ('args.user.name="Ann Lee" args.tenant_id=7', {"t7"}),
        ("args.user.id=7", {"t42", "t7"}),
        ("args.flag=true", {"t42"}),
        ("args.flag=false", {"t42s"}),
        ("args.note=null", {"t7"}),
        ("args.price=2.5", {"odd"}),
        ("args.contains=x", {"odd"}),  # a key named like a lookup stays a key
        ("args.my-key=y", {"odd"}),
        ("args.items.1=b", {"odd"}),
        ("args.tenant_id=43", set()),
        ("args.nowhere.deep=1", set()),
        # No JSON number: searched as text, which no database refuses (they were 500s).
        ("args.tenant_id=NaN", set()),
        ('args.tenant_id="Infinity"', set()),
        ("args.tenant_id=-Infinity", set()),
        ("args.tenant_id=1e400", set()),
        ("args.tenant_id=99999999999999999999999", set()),
    ],
)
def test_search_inside_arguments(
    admin_client: Client, jobs: dict[str, Job], term: str, expected: set[str]
) -> None:
    assert found(admin_client, term) == {jobs[name].pk for name in expected}


@pytest.mark.parametrize(
    ("term", "says"),
    [
        ("args.=1", "Bad key path"),
        ("args.tenant_id", "Cannot read"),
        ("args.tenant_id=", "No value"),
        ("args.a..b=1", "Bad key path"),
        ("args.a b=1", "Cannot read"),
        ("args.x=1 tenant", "Cannot read"),
        ('args.x="unfinished', "Bad quoted string"),
        ("args.a'b=1", "Bad key path"),
        ("args." + ".".join("k" * 9) + "=1", "deeper than"),
        (" ".join(f"args.k{i}=1" for i in range(6)), "At most"),
        (r'args.x="\u0000"', "NUL"),
    ],
)
def test_bad_search_says_why_and_shows_nothing(
    admin_client: Client, jobs: dict[str, Job], term: str, says: str
) -> None:
    response = admin_client.get(url("job_changelist"), {"q": term})
    assert response.status_code == 200
    assert not response.context["cl"].result_list
    shown = [str(message) for message in response.context["messages"]]
    assert len(shown) == 1 and shown[0].startswith("Search: ") and says in shown[0], shown


def test_other_searches_work_as_before(admin_client: Client, jobs: dict[str, Job]) -> None:
    job = jobs["t42"]
    Job.objects.filter(pk=job.pk).update(type="reports.args", unique_key="args-less")
    assert found(admin_client, str(job.pk)) == {job.pk}
    assert found(admin_client, "reports.args") == {job.pk}
    assert found(admin_client, "args-less") == {job.pk}


@pytest.mark.parametrize(
    ("term", "clauses"),
    [
        ("args.a=1", [(["a"], [1, "1"])]),
        ('args.a.b="x y"', [(["a", "b"], ["x y"])]),
        (r'args.a="say \"hi\""', [(["a"], ['say "hi"'])]),
        ('args.a="42"', [(["a"], [42, "42"])]),
        ('args.a="true"', [(["a"], ["true"])]),
        ("args.a=1e3", [(["a"], [1000.0, "1e3"])]),
        ("args.a=[1]", [(["a"], ["[1]"])]),  # bare text, not JSON
        ("args.a=NaN", [(["a"], ["NaN"])]),
        ("args.a=1e400", [(["a"], ["1e400"])]),
    ],
)
def test_the_grammar(term: str, clauses: list[tuple[list[str], list[Any]]]) -> None:
    assert argsearch.parse(term) == clauses


def test_postgresql_answers_the_search_from_its_index(jobs: dict[str, Job]) -> None:
    """On PostgreSQL the GIN index of migration 0025 answers each clause's containment test
    (a table of a million jobs: 4 s read row by row, 0.06-0.15 s through the index,
    bench/admin_scale.py); elsewhere there is no such index and the search reads the rows."""
    from django.db import connection

    queryset = argsearch.filtered(
        Job.objects.all(), argsearch.parse('args.tenant_id=42 args.user.name="Ann Lee"')
    )
    assert set(queryset.values_list("pk", flat=True)) == {jobs["t42"].pk}
    if connection.vendor != "postgresql":
        assert "@>" not in str(queryset.query)
        return
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # a small table: make it choose
        plan = queryset.explain()
    assert "jobqueue_job_args_gin" in plan, plan
    # A list index has no containment test: a list is not an object of digit keys.
    listed = argsearch.filtered(Job.objects.all(), argsearch.parse("args.items.1=b"))
    assert "@>" not in str(listed.query)
    assert set(listed.values_list("pk", flat=True)) == {jobs["odd"].pk}
