"""Units taken while a job runs and settled by what was used: ctx.acquire() and ctx.settle(),
with an in-process worker. The same across worker processes:
tests/limits/test_budgets_workers.py."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db.models import Sum

import django_jobqueue as jobqueue
from django_jobqueue import signals
from django_jobqueue.models import Job, JobStep, MinuteSpend, ResourceStart
from django_jobqueue.testing import run_jobs
from tests.support.workflow_support import run_burst

pytestmark = pytest.mark.django_db(transaction=True)

LIMITS = {
    "tokens": {"rate": "100/s"},
    "daily:*": {"rate": "1000/d"},
    "slots": {"concurrency": 2},
}


@pytest.fixture(autouse=True)
def limits(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "LIMITS": LIMITS}


def window_units(resource: str) -> int:
    return ResourceStart.objects.filter(resource=resource).aggregate(n=Sum("units"))["n"] or 0


def test_a_grant_is_taken_from_the_window_and_settled_by_what_was_used():
    job = jobqueue.enqueue("budgets.calls", {"resource": "daily:7", "calls": 3, "estimate": 100,
                                             "used": 40})  # fmt: skip
    assert run_burst() == 0
    done = Job.objects.get(pk=job.pk)
    assert done.state == "done" and [c["used"] for c in done.result] == [40, 40, 40]
    # Each grant took 100, each settlement gave 60 back: the window counts what was used.
    assert window_units("daily:7") == 120
    kinds = sorted(ResourceStart.objects.values_list("kind", "units"))
    assert kinds == [("grant", 100)] * 3 + [("settle", -60)] * 3


def test_a_settlement_above_its_grant_is_charged_to_its_window():
    jobqueue.enqueue("budgets.calls", {"resource": "daily:8", "estimate": 100, "used": 250})
    assert run_burst() == 0
    assert window_units("daily:8") == 250


def test_a_job_without_room_suspends_without_its_lease_and_runs_once_there_is_room():
    """A full window: the job waits `scheduled`, with no lease and its attempt untouched,
    until the window's oldest grant leaves it; then the call returns. (Its two calls of 60
    come a few milliseconds apart, the second finding 60 of the second's 100 taken: two jobs
    run one after the other could be a second apart on a busy machine.)"""
    second = jobqueue.enqueue("budgets.calls", {"resource": "tokens", "calls": 2, "estimate": 60})
    assert run_burst() == 0
    waiting = Job.objects.get(pk=second.pk)
    assert (waiting.state, waiting.lease_owner, waiting.attempts) == ("scheduled", None, 0)
    assert waiting.run_after is not None
    deadline = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=30)
    while Job.objects.get(pk=second.pk).state != "done":
        assert dt.datetime.now(dt.UTC) < deadline
        run_burst()
    assert Job.objects.get(pk=second.pk).attempts == 1


def test_a_replay_gets_the_same_grant_and_never_settles_twice():
    """A job that acquired and settled, then failed once: its second run replays both calls
    from their records, taking and settling nothing again."""
    job = jobqueue.enqueue("durable.budget_then_fail", {"fail_once": True}, max_attempts=2)
    assert run_burst() == 0
    while Job.objects.get(pk=job.pk).state not in ("done", "dead"):
        run_burst()
    done = Job.objects.get(pk=job.pk)
    assert (done.state, done.attempts) == ("done", 2)
    first, second = done.result["grants"]
    assert first == second  # the same grant: its time and units
    assert ResourceStart.objects.filter(kind="grant").count() == 1
    assert ResourceStart.objects.filter(kind="settle").count() == 1
    assert JobStep.objects.filter(job_id=job.pk, name="@settle").count() == 1


def test_settle_corrects_the_units_the_jobs_uses_took_at_its_claim():
    jobqueue.enqueue("budgets.settle_uses", {"used": 30}, uses={"tokens": 50})
    assert run_burst() == 0
    assert window_units("tokens") == 30
    # (A busy machine may hand the job back once before it starts: its units go back too.)
    assert list(ResourceStart.objects.filter(kind="usettle").values_list("units")) == [(-20,)]


def test_units_settled_is_sent_once_per_settlement():
    seen = []

    def receiver(sender, **kwargs):
        seen.append((kwargs["resource"], kwargs["granted"], kwargs["used"], kwargs["job_type"]))

    signals.units_settled.connect(receiver)
    try:
        jobqueue.enqueue("budgets.calls", {"resource": "daily:1", "calls": 2, "estimate": 10,
                                           "used": 4})  # fmt: skip
        assert run_burst() == 0
    finally:
        signals.units_settled.disconnect(receiver)
    assert seen == [("daily:1", 10, 4, "budgets.calls")] * 2


@pytest.mark.parametrize(
    ("resource", "units", "match"),
    [
        ("slots", 1, "has no rate"),
        ("nope", 1, "not a resource"),
        ("tokens", 101, "could never be granted"),
        ("tokens", 0, "integer >= 1"),
        ("tokens", True, "integer >= 1"),
        ("daily:*", 1, "must not contain"),
        ("tenant:\x1b", 1, "control characters"),
    ],
)
def test_bad_acquires_fail_the_job_before_anything_is_written(resource, units, match):
    job = jobqueue.enqueue("budgets.acquire", {"resource": resource, "units": units},
                           max_attempts=1)  # fmt: skip
    assert run_burst() == 0
    dead = Job.objects.get(pk=job.pk)
    assert dead.state == "dead"
    assert dead.last_error["type"] == "django_jobqueue.exceptions.InvalidJobError"
    assert match in dead.last_error["message"]
    assert not ResourceStart.objects.exists()
    assert not JobStep.objects.filter(job_id=job.pk).exists()


def test_run_jobs_grants_at_once_and_counts_nothing():
    jobqueue.enqueue("budgets.calls", {"resource": "tokens", "calls": 3, "estimate": 90})
    report = run_jobs()
    assert [j.state for j in report.jobs] == ["done"]
    assert not ResourceStart.objects.exists()


def test_a_day_rate_is_a_rate():
    from django_jobqueue.limits import parse_limits

    assert parse_limits({"t": {"rate": "2000000/d"}})["t"].rate == (2_000_000, 86_400)
    assert parse_limits({"t": {"rate": "5/d"}})["t"].describe()["rate"] == "5/d"


def test_operators_see_the_units_granted_settled_and_spent(admin_client):
    """jobqueue_limits --json shows, per rated resource, the units granted in its window, the
    units their settlements said were used, and what the rate counts; the admin's Limits
    page shows each handler's spend of each resource over the last hour and day."""
    import json
    from io import StringIO

    from django.core.management import call_command

    from tests.support.admin_support import url

    jobqueue.enqueue("budgets.calls", {"resource": "daily:7", "calls": 3, "estimate": 100,
                                       "used": 40})  # fmt: skip
    assert run_burst() == 0
    out = StringIO()
    call_command("jobqueue_limits", "--json", stdout=out)
    entry = {e["name"]: e for e in json.loads(out.getvalue())["limits"]}["daily:7"]
    assert (entry["granted_in_window"], entry["settled_in_window"]) == (300, 120)
    assert entry["started_in_window"] == 120
    html = admin_client.get(url("limit_changelist")).content.decode()
    spend = html[html.index('id="jq-spend"') :]
    assert "daily:7" in spend and "budgets.calls" in spend and "<td>120</td>" in spend


def test_rows_that_every_window_left_are_forgotten():
    """The recorder's pass forgets grants' rows older than their resource's period (and the
    margin); the rows still in a window stay, and those of a resource no longer rated stay
    for the longest period."""
    from django_jobqueue import conf
    from django_jobqueue.dialects import get_dialect
    from django_jobqueue.limits import live, window

    dialect = get_dialect("default")
    now = dialect.now()
    rows = [("tokens", 2), ("tokens", 0.5), ("daily:1", 3600), ("daily:1", 90000),
            ("gone", 3600), ("gone", 90000)]  # fmt: skip
    ResourceStart.objects.bulk_create(
        ResourceStart(resource=name, started_at=now - dt.timedelta(seconds=age), units=1,
                      kind=ResourceStart.Kind.GRANT)
        for name, age in rows
    )  # fmt: skip
    assert window.forget(dialect, live.in_force(conf.get(), "default")) == 3
    left = sorted(ResourceStart.objects.values_list("resource", flat=True))
    assert left == ["daily:1", "gone", "tokens"]


@pytest.mark.parametrize("first", [True, False], ids=["first-record", "later-record"])
def test_a_grant_or_settlement_of_a_lost_lease_writes_nothing(first):
    """A worker whose lease is gone (the job was claimed by another meanwhile) gets LeaseLost
    from acquire and from settle, and neither the window nor the records change: the record
    and the window's rows are written together, fenced by the lease, or not at all."""
    from django.db import connection

    from django_jobqueue.dialects import get_dialect
    from django_jobqueue.engine import durable, leases
    from django_jobqueue.engine.context import JobContext
    from django_jobqueue.exceptions import LeaseLost

    job = jobqueue.enqueue("test.noop")
    dialect = get_dialect(connection.alias)
    [claimed] = leases.claim(dialect, owner="w1", queues=[], limit=1, lease_ttl=30)
    ctx = JobContext(claimed.model(), claimed.attempts, "w1", 30.0, dialect)
    if not first:
        ctx.step("warm-up", lambda: 1)
    grant, unsettled = ctx.acquire("daily:3", 10), ctx.acquire("daily:3", 10)
    ctx.settle(grant, 4)
    durable.flush(ctx)  # a give-back waits for the job's next round trip: the run's end here
    before = (window_units("daily:3"), JobStep.objects.filter(job_id=job.pk).count())
    assert before[0] == 14
    Job.objects.filter(pk=job.pk).update(lease_owner="w2", attempts=claimed.attempts + 1)
    with pytest.raises(LeaseLost):
        ctx.acquire("daily:3", 10)
    with pytest.raises(LeaseLost):
        ctx.settle(unsettled, 12)  # a charge: written at once
    ctx.settle(unsettled, 1)  # a give-back: deferred, and refused where it is written
    with pytest.raises(LeaseLost):
        durable.flush(ctx)
    assert (window_units("daily:3"), JobStep.objects.filter(job_id=job.pk).count()) == before
    spent = MinuteSpend.objects.filter(resource="daily:3").aggregate(n=Sum("units"))["n"]
    assert spent == 14


def test_a_give_back_is_written_with_the_jobs_next_round_trip():
    """A settlement at or below its grant is written with the job's next grant (in its
    transaction), before its next durable call, or when its run ends; units_settled is sent
    once it is written. A charge (above the grant) is written at once."""
    from django.db import connection

    from django_jobqueue.dialects import get_dialect
    from django_jobqueue.engine import durable, leases
    from django_jobqueue.engine.context import JobContext
    from django_jobqueue.exceptions import Suspend

    seen = []

    def receiver(sender, **kwargs):
        seen.append((kwargs["grant"], kwargs["used"]))

    job = jobqueue.enqueue("test.noop")
    dialect = get_dialect(connection.alias)
    [claimed] = leases.claim(dialect, owner="w1", queues=[], limit=1, lease_ttl=30)
    ctx = JobContext(claimed.model(), claimed.attempts, "w1", 30.0, dialect)
    signals.units_settled.connect(receiver)
    try:
        first = ctx.acquire("daily:4", 10)
        ctx.settle(first, 4)
        assert (window_units("daily:4"), seen) == (10, [])  # not written yet
        second = ctx.acquire("daily:4", 10)  # writes it first, in the grant's transaction
        assert (window_units("daily:4"), seen) == (14, [(first.key, 4)])
        ctx.settle(second, 10)
        ctx.step("after", lambda: 1)  # a durable call writes it before its own record
        assert (window_units("daily:4"), seen[-1]) == (14, (second.key, 10))
        third = ctx.acquire("daily:4", 10)
        ctx.settle(third, 15)  # a charge: at once
        assert (window_units("daily:4"), seen[-1]) == (29, (third.key, 15))
        fourth = ctx.acquire("daily:4", 10)
        ctx.settle(fourth, 0)
        assert window_units("daily:4") == 39
        durable.flush(ctx)  # what the worker does when the run ends
        assert (window_units("daily:4"), seen[-1]) == (29, (fourth.key, 0))
        fifth = ctx.acquire("daily:4", 10)
        ctx.settle(fifth, 5)
        with pytest.raises(Suspend):  # no room: the run ends, and the give-back is written
            ctx.acquire("daily:4", 1000)
        durable.flush(ctx)
        assert (window_units("daily:4"), seen[-1]) == (34, (fifth.key, 5))
    finally:
        signals.units_settled.disconnect(receiver)
    settles = JobStep.objects.filter(job_id=job.pk, name="@settle").order_by("place")
    assert [s.result["used"] for s in settles] == [4, 10, 15, 0, 5]
    assert len(seen) == 5


def test_on_postgresql_a_grant_and_the_settlement_before_it_are_one_query():
    """PostgreSQL: a settlement that gives back sends nothing; the job's next grant sends the
    resource's lock, that settlement and the grant's one statement, with its COMMIT, as one
    query (a simple query of several statements: one round trip)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_jobqueue.dialects import get_dialect
    from django_jobqueue.engine import leases
    from django_jobqueue.engine.context import JobContext

    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's round trips")
    job = jobqueue.enqueue("test.noop")
    dialect = get_dialect(connection.alias)
    [claimed] = leases.claim(dialect, owner="w1", queues=[], limit=1, lease_ttl=30)
    ctx = JobContext(claimed.model(), claimed.attempts, "w1", 30.0, dialect)
    first = ctx.acquire("daily:6", 10)  # the job's first record (it marks the job's row)
    with CaptureQueriesContext(connection) as queries:
        ctx.settle(first, 4)
        assert queries.captured_queries == []
        second = ctx.acquire("daily:6", 10)
    grants = [q["sql"] for q in queries.captured_queries if '"django_jobqueue_limit"' in q["sql"]]
    [sql] = grants
    lock, settle, grant = sql.index("FOR UPDATE"), sql.index("'@settle'"), sql.index("WITH t AS")
    assert lock < settle < grant and sql.endswith("; COMMIT")
    assert window_units("daily:6") == 14
    record = JobStep.objects.get(job_id=job.pk, name="@acquire", seq=2).result
    assert dt.datetime.fromisoformat(record["granted_at"]) == second.granted_at
