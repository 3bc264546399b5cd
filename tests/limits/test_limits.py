"""JOBQUEUE["LIMITS"] and `uses=`: what is refused, what every entry point stores, and what a
claim admits (several limits, patterns, costs, cooldowns, live changes). The same across
worker processes: tests/limits/test_limits_workers.py."""

from __future__ import annotations

import json
import time
from io import StringIO

import pytest
from django.core.checks import run_checks
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import django_jobqueue as jobqueue
from django_jobqueue import conf
from django_jobqueue.backends import HAS_TASKS
from django_jobqueue.dialects import get_dialect
from django_jobqueue.engine import attempts, leases, outcomes
from django_jobqueue.engine.fair_selection import FairShare
from django_jobqueue.exceptions import InvalidJobError
from django_jobqueue.models import Job, Limit
from django_jobqueue.testing import run_jobs
from tests.support.markers import needs_skip_locked

pytestmark = pytest.mark.django_db(transaction=True)

LIMITS = {
    "api": {"concurrency": 2},
    "openai": {"rate": "500/m"},
    "tokens": {"rate": "100/s"},
    "tenant:*": {"concurrency": 1},
    "tenant:vip*": {"concurrency": 3},
}


@pytest.fixture(autouse=True)
def limits(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "LIMITS": LIMITS}


def claim(limit: int = 10, owner: str = "w") -> list[int]:
    """One claim, as a worker's dispatcher makes it; the ids it took."""
    fair_share = FairShare(conf.get())
    jobs = leases.claim(
        get_dialect("default"), owner=owner, queues=[], limit=limit, lease_ttl=60,
        fair_share=fair_share,
    )  # fmt: skip
    return [job.pk for job in jobs]


def work(uses=None, **options):
    return jobqueue.enqueue("limits.work", uses=uses, **options)


# -- bad input, before anything is written -----------------------------------------------------


@pytest.mark.parametrize(
    ("uses", "match"),
    [
        ({"nope": 1}, "not a resource"),
        ({"api": 0}, ">= 1"),
        ({"api": True}, ">= 1"),
        ({"api": 3}, "could never start"),
        ({"tokens": 101}, "could never start"),
        ({"tenant:42": 2}, "could never start"),
        (["api"], "must map"),
        ({"tenant:\x1b": 1}, "not a resource"),
        ({"tenant:*": 1}, "is a pattern"),
        ({"tenant:vip*": 1}, "is a pattern"),
    ],
)
def test_bad_uses_are_refused_before_any_write(uses, match):
    with pytest.raises(InvalidJobError, match=match):
        work(uses=uses)
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    "bad",
    [
        {"api": 2},
        {"api": {"concurrency": 0}},
        {"api": {"rate": "5/w"}},
        {"api": {"burst": 1}},
        {"a*b": {"concurrency": 1}},
        {"": {"concurrency": 1}},
    ],
)
def test_malformed_limits_are_a_check_error(settings, bad):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "LIMITS": bad}
    assert "django_jobqueue.E001" in [m.id for m in run_checks()]


def test_rate_limited_refuses_bad_arguments():
    with pytest.raises(ValueError, match="negative"):
        jobqueue.RateLimited("api", retry_after=-1)
    with pytest.raises(TypeError):
        jobqueue.RateLimited("api", retry_after="20")
    with pytest.raises(TypeError):
        jobqueue.RateLimited(42, retry_after=1)  # type: ignore[arg-type]


# -- uses on every entry point -------------------------------------------------------------------


def test_every_entry_point_stores_what_a_job_uses():
    uses = {"api": 1, "tenant:7": 1}
    one = work(uses=uses)
    [many] = jobqueue.enqueue_many([{"type": "limits.work", "uses": uses}])
    with jobqueue.graph() as g:
        node = g.add("limits.work", uses=uses)
    assert {tuple(sorted(Job.objects.get(pk=j.pk).uses.items())) for j in (one, many, node)} == {
        (("api", 1), ("tenant:7", 1))
    }


def test_a_spawned_child_and_a_django_task_store_what_they_use():
    parent = jobqueue.enqueue("limits.spawner")
    run_jobs(ignore_delays=True)
    [child] = Job.objects.get(pk=parent.pk).result
    assert Job.objects.get(pk=child).uses == {"api": 1}
    if HAS_TASKS:
        from tests.testapp import tasks

        result = tasks.add.using(uses={"tenant:7": 1}).enqueue(1, 2)
        assert Job.objects.get(pk=int(result.id)).uses == {"tenant:7": 1}


def test_a_handler_gives_a_default_from_the_arguments():
    job = jobqueue.enqueue("limits.tenant_work", {"tenant": 42})
    assert Job.objects.get(pk=job.pk).uses == {"tenant:42": 1}
    # enqueue_many() of (type, args) specs too: each job from its own arguments.
    many = jobqueue.enqueue_many([("limits.tenant_work", {"tenant": t}) for t in (1, 2, 1)])
    assert [Job.objects.get(pk=j.pk).uses for j in many] == [
        {"tenant:1": 1},
        {"tenant:2": 1},
        {"tenant:1": 1},
    ]
    assert [j.state for j in many] == ["ready"] * 3
    assert Job.objects.get(pk=jobqueue.enqueue("limits.static_default").pk).uses == {"api": 1}
    mine = jobqueue.enqueue("limits.tenant_work", {"tenant": 42}, uses={"api": 1})
    assert Job.objects.get(pk=mine.pk).uses == {"api": 1}  # given: the default is not used


def test_a_handler_default_that_fails_on_the_arguments_is_bad_input():
    with pytest.raises(InvalidJobError, match=r"limits\.tenant_work.*KeyError"):
        jobqueue.enqueue("limits.tenant_work", {"sleep": 1.0})  # no "tenant" to read
    with pytest.raises(InvalidJobError, match="KeyError"):
        jobqueue.enqueue_many([("limits.tenant_work", {"tenant": 1}), ("limits.tenant_work", {})])
    assert not Job.objects.exists()


def test_units_may_use_a_raised_cap_and_wait_out_a_lowered_one():
    with pytest.raises(InvalidJobError, match="allows 1"):
        work(uses={"tenant:9": 3})
    call_command("jobqueue_limits", "set", "tenant:9", "--concurrency", "3", stdout=StringIO())
    raised = work(uses={"tenant:9": 3})  # the cap in force allows them
    with pytest.raises(InvalidJobError, match="allows 3"):
        work(uses={"tenant:9": 4})
    call_command("jobqueue_limits", "set", "api", "--concurrency", "1", stdout=StringIO())
    lowered = work(uses={"api": 2})  # the settings' cap allows them: it waits for a reset
    assert claim() == [raised.pk]
    call_command("jobqueue_limits", "reset", "api", stdout=StringIO())
    assert claim() == [lowered.pk]


def test_a_batch_reads_the_limits_in_force_once():
    call_command("jobqueue_limits", "set", "tenant:9", "--concurrency", "3", stdout=StringIO())
    specs = [{"type": "limits.work", "uses": {"tenant:9": 2}, "group": "g"}] * 20
    with CaptureQueriesContext(connection) as seen:
        jobs = jobqueue.enqueue_many(specs)
    assert len(jobs) == 20
    reads = [q for q in seen.captured_queries if "limitsetting" in q["sql"].lower()]
    assert len(reads) == 1


def test_a_schedule_passes_what_its_jobs_use(settings):
    from django_jobqueue import schedules

    schedule = schedules.parse("s", {"handler": "limits.work", "every": 60, "uses": {"api": 1}})
    assert schedule.job_options(timezone.now()).uses == {"api": 1}
    # {} means "none", as for enqueue(): not the handler's default.
    none = schedules.parse("n", {"handler": "limits.tenant_work", "every": 60, "uses": {}})
    assert none.job_options(timezone.now()).uses == {}
    with pytest.raises(Exception, match="not a resource"):
        schedules.parse("s", {"handler": "limits.work", "every": 60, "uses": {"no": 1}})


# -- the claim -------------------------------------------------------------------------------------


def test_a_pattern_gives_every_tenant_its_own_cap():
    first = [work(uses={"tenant:1": 1}) for _ in range(3)]
    second = [work(uses={"tenant:2": 1}) for _ in range(2)]
    taken = claim()
    assert taken == [first[0].pk, second[0].pk]
    assert claim() == []  # both tenants are at their cap
    vip = [work(uses={"tenant:vip9": 1}) for _ in range(4)]  # the longest pattern wins: 3
    assert claim() == [j.pk for j in vip[:3]]
    assert set(Limit.objects.values_list("name", flat=True)) == {
        "tenant:1",
        "tenant:2",
        "tenant:vip9",
    }


def test_resource_names_are_matched_exactly_whatever_they_hold():
    # Quotes, backslashes, commas, braces, spaces and "NULL": each a tenant of its own, locked
    # and counted as itself (on PostgreSQL the names travel as one array literal's text).
    names = ['tenant:a"b', "tenant:a\\b", "tenant:x,y", "tenant:{z}", "tenant: s ", "tenant:NULL"]
    jobs = {name: [work(uses={name: 1}) for _ in range(2)] for name in names}
    assert sorted(claim(limit=20)) == sorted(found[0].pk for found in jobs.values())
    assert claim(limit=20) == []  # every one of them is at its cap
    assert set(Limit.objects.values_list("name", flat=True)) == set(names)
    Job.objects.filter(pk=jobs["tenant:x,y"][0].pk).update(
        state="done", lease_owner=None, lease_expires=None, finished_at=timezone.now()
    )
    assert claim(limit=20) == [jobs["tenant:x,y"][1].pk]


def test_a_job_meets_every_limit_it_uses():
    both = [work(uses={"api": 1, "tenant:7": 1}) for _ in range(2)]
    api_only = [work(uses={"api": 1}) for _ in range(3)]
    # tenant:7 takes one; api (cap 2) one more, from the jobs that only use it.
    assert claim() == [both[0].pk, api_only[0].pk]
    assert claim() == []


def test_costs_count_against_a_rate():
    jobs = [work(uses={"tokens": 30}) for _ in range(5)]
    assert claim() == [j.pk for j in jobs[:3]]  # 90 of 100 tokens this second
    assert claim() == []


def test_jobs_without_uses_are_not_held_back():
    held = [work(uses={"api": 1}) for _ in range(3)]
    free = [work() for _ in range(3)]
    assert sorted(claim()) == sorted([held[0].pk, held[1].pk, *(j.pk for j in free)])


def test_a_rate_limited_job_closes_its_resource_and_waits_without_using_its_attempt():
    limited = jobqueue.enqueue(
        "limits.rate_limited_once", {"resource": "api", "retry_after": 2.0}, uses={"api": 1},
        max_attempts=1,
    )  # fmt: skip
    other = work(uses={"api": 1})
    dialect, settings = get_dialect("default"), conf.get()
    [claimed] = leases.claim(dialect, owner="w", queues=[], limit=1, lease_ttl=60,
                             fair_share=FairShare(settings))  # fmt: skip
    assert claimed.pk == limited.pk
    flight = attempts.InFlight(
        job=claimed, lease=leases.Lease(claimed.pk, "w", claimed.attempts), claimed=0.0
    )
    outcome = attempts.run(dialect, settings, flight)  # as a worker's handler thread does
    assert isinstance(outcome.error, jobqueue.RateLimited)
    assert outcomes.record(dialect, settings, "w", [outcome]) == []  # as its completer does
    row = Job.objects.get(pk=limited.pk)
    assert (row.state, row.attempts, row.lease_owner) == ("scheduled", 0, None)
    assert Limit.objects.get(name="api").closed_until is not None
    assert claim() == []  # api is closed: `other` waits, though api has room
    time.sleep(2.1)  # 2 s: the steps above take longer than a short cooldown on a loaded machine
    run_jobs(ignore_delays=False)
    done = Job.objects.get(pk=limited.pk)
    assert (done.state, done.attempts, done.result) == ("done", 1, "after the cooldown")
    assert Job.objects.get(pk=other.pk).state == "done"


def test_a_job_rate_limited_twice_ends_done_with_one_attempt_and_signals_each_closure():
    from django_jobqueue import signals

    heard: list[dict] = []

    def receiver(sender, **kwargs):
        heard.append(kwargs)

    job = jobqueue.enqueue(
        "limits.rate_limited_twice", {"resource": "api"}, uses={"api": 1}, max_attempts=1
    )
    signals.job_rate_limited.connect(receiver)
    try:
        run_jobs()  # each cooldown is over at once (ignore_delays)
    finally:
        signals.job_rate_limited.disconnect(receiver)
    done = Job.objects.get(pk=job.pk)
    assert (done.state, done.attempts, done.result) == ("done", 1, "after two cooldowns")
    assert [(h["job_id"], h["resource"], h["retry_after"], h["state"]) for h in heard] == [
        (job.pk, "api", 0.5, "scheduled"),
        (job.pk, "api", 1.0, "scheduled"),
    ]


@pytest.fixture
def long_skips(monkeypatch):
    """A resource found without room stays out of the claims for a minute, not a quarter of a
    second: a loaded machine may take that long between two claims of a test."""
    from django_jobqueue.limits import resources as quotas

    monkeypatch.setattr(quotas, "HELD_FOR", 60.0)
    monkeypatch.setattr(quotas, "OVERRIDES_EVERY", 60.0)


def test_a_claim_fetches_more_candidates_only_after_refusals_left_it_short(monkeypatch, long_skips):
    """A claim under LIMITS locks its limit's worth of candidates and one more while none is
    refused; after refusals left a claim short, the next fetches twice as many (up to
    admission.OVERFETCH times); once none is refused it comes down again. Every job that can
    start is found."""
    fair_share, dialect = FairShare(conf.get()), get_dialect("default")
    busy = [work(uses={"tenant:1": 1}) for _ in range(8)]  # one may start: the rest wait
    free = [work(uses={f"tenant:{n}": 1}) for n in range(2, 8)]
    reads: list[tuple[str, int]] = []  # the (group, count) reads the claims' statements made
    group_reads_sql = dialect.group_reads_sql

    def observed(query, wanted, indexes, compiled):  # type: ignore[no-untyped-def]
        reads.extend(wanted)
        return group_reads_sql(query, wanted, indexes, compiled)

    monkeypatch.setattr(dialect, "group_reads_sql", observed)

    def take(limit: int) -> tuple[list[int], set[int]]:
        reads.clear()
        jobs = leases.claim(dialect, owner="w", queues=[], limit=limit, lease_ttl=60,
                            fair_share=fair_share)  # fmt: skip
        return [job.pk for job in jobs], {count for _, count in reads}

    taken, fetched = take(3)  # 4 candidates, all of tenant 1: one starts, three are refused
    assert (taken, 4 in fetched) == ([busy[0].pk], True)
    taken, fetched = take(3)  # twice as many (tenant 1, found full, is skipped a moment)
    assert (taken, 8 in fetched) == ([j.pk for j in free[:3]], True)
    taken, fetched = take(3)  # none was refused: back to 4
    assert (taken, 4 in fetched, 8 in fetched) == ([j.pk for j in free[3:]], True, False)


def test_a_worker_looks_again_at_a_capped_resource_once_its_jobs_end(long_skips):
    """A resource found full is skipped by the next claims for a moment; when the worker's
    own jobs end (its completer recorded them), one held back by its concurrency cap is
    looked at again at once, one held back by a rate is not."""
    [work(uses={"api": 1}) for _ in range(3)]
    [work(uses={"tokens": 60}) for _ in range(2)]
    fair_share = FairShare(conf.get())
    dialect = get_dialect("default")
    claimed = leases.claim(dialect, owner="w", queues=[], limit=10, lease_ttl=60,
                           fair_share=fair_share)  # fmt: skip
    assert len(claimed) == 3  # two of api, one of tokens
    resources = fair_share.resources
    assert resources.skipped() == ["api", "tokens"]
    assert fair_share.jobs_ended() is True
    assert resources.skipped() == ["tokens"]
    assert fair_share.jobs_ended() is False  # nothing capped is held back any more


def test_a_claim_counts_what_the_claim_that_held_its_resource_started():
    """Two claims of one capped resource (`api`, 2). While the first holds the resource's row
    (in the middle of its transaction, one job started), the second passes over the resource
    without waiting (PostgreSQL, MariaDB) and starts none of its jobs; once the first has
    committed, a claim reads the jobs in flight afresh, sees the first one's, and starts one
    more, not two. On SQLite the second claim waits for the write lock instead, then counts."""
    import threading

    from django.db import connections

    first, *others = [work(uses={"api": 1}) for _ in range(4)]
    Limit.objects.get_or_create(name="api")
    held, let_go = threading.Event(), threading.Event()
    outcome: dict[str, object] = {}
    skips = get_dialect("default").has_select_for_update_skip_locked

    def hold() -> None:
        dialect = get_dialect("default")

        def txn() -> None:
            list(Limit.objects.select_for_update().filter(name="api").values_list("name"))
            dialect.mark_claimed([first.pk], owner="first", lease_ttl=60)
            held.set()
            let_go.wait(60)

        try:
            dialect.run_in_transaction(txn)
        finally:
            held.set()
            connections.close_all()

    def second() -> None:
        try:
            outcome["during"] = claim(owner="second")
        finally:
            connections.close_all()

    threads = [threading.Thread(target=hold), threading.Thread(target=second)]
    threads[0].start()
    try:
        assert held.wait(60)
        threads[1].start()
        if skips:
            threads[1].join(60)
            assert not threads[1].is_alive(), "the second claim waited for the held resource"
        else:
            time.sleep(0.5)  # SQLite: the second claim waits for the write lock by then
    finally:
        let_go.set()
        for thread in threads:
            thread.join(60)
    during = outcome["during"]
    assert isinstance(during, list)
    after = during if not skips else claim(owner="third")
    assert during == [] if skips else len(during) == 1
    assert len(after) == 1 and after[0] in [j.pk for j in others]
    assert Job.objects.filter(state="running").count() == 2


def test_fair_share_splits_the_free_slots_among_the_groups_whose_jobs_can_start(monkeypatch):
    """Under LIMITS the groups' weights still split the slots, among the groups whose jobs can
    start: a heavier group whose jobs all wait for their tenant (at its cap) does not take the
    slots of every claim, starting nothing (the first claim finds it out; the next ones give
    its share to the others)."""
    from django_jobqueue.engine import admission

    monkeypatch.setattr(admission, "HELD_BACK_FOR", 60.0)  # however slowly the claims go
    busy = work(uses={"tenant:9": 1}, group="c")
    assert claim(limit=1) == [busy.pk]  # tenant 9 is at its cap of 1 from now on
    heavy = {work(uses={"openai": 1}, group="a", weight=3).pk for _ in range(30)}
    light = {work(uses={"openai": 1}, group="b", weight=1).pk for _ in range(30)}
    held_back = {work(uses={"tenant:9": 1}, group="c", weight=10).pk for _ in range(30)}
    fair_share = FairShare(conf.get())  # one worker's, kept from claim to claim
    taken: list[set[int]] = []
    for _ in range(4):
        jobs = leases.claim(get_dialect("default"), owner="w", queues=[], limit=8,
                            lease_ttl=60, fair_share=fair_share)  # fmt: skip
        taken.append({job.pk for job in jobs})
    every = set().union(*taken)
    assert not every & held_back
    assert all(len(batch) >= 6 for batch in taken[1:]), [len(batch) for batch in taken]
    a, b = len(every & heavy), len(every & light)
    assert a >= 2 * b and b >= 3, (a, b)  # about 3 to 1, as their weights


@needs_skip_locked(
    "SQLite's writers take turns on the whole database: every claim waits for any other"
)
def test_a_claim_never_waits_for_a_lock_that_another_tenants_claim_holds():
    """Another claim, of tenant 1, holds tenant 1's resource row and its job's row, in the
    middle of its transaction: a claim meanwhile skips that job and starts tenant 2's, without
    waiting for the other claim to end (it would wait as long as that one holds)."""
    import threading

    from django.db import connections

    mine, theirs = work(uses={"tenant:2": 1}), work(uses={"tenant:1": 1})
    Limit.objects.bulk_create([Limit(name="tenant:1"), Limit(name="tenant:2")])
    held, let_go, released = threading.Event(), threading.Event(), threading.Event()

    def other_claim() -> None:
        def txn() -> None:
            list(Limit.objects.select_for_update().filter(name="tenant:1").values_list("name"))
            list(Job.objects.select_for_update().filter(pk=theirs.pk).values_list("pk"))
            held.set()
            let_go.wait(60)

        try:
            get_dialect("default").run_in_transaction(txn)
        finally:
            released.set()
            held.set()
            connections.close_all()

    thread = threading.Thread(target=other_claim)
    thread.start()
    try:
        assert held.wait(60)
        taken = claim()
        assert not released.is_set(), "the claim waited for the other tenant's claim to end"
    finally:
        let_go.set()
        thread.join(60)
    assert taken == [mine.pk]


def test_on_postgresql_a_claim_sends_its_bounds_and_its_lock_with_other_statements():
    """PostgreSQL, a worker's claim under LIMITS: the transaction's lock bounds travel with its
    first statement, and the resources' lock with the read of the jobs in flight (a simple
    query of several statements: one round trip each, not two)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's round trips")
    work(uses={"api": 1})
    work(uses={"tenant:3": 1})
    Limit.objects.bulk_create([Limit(name="api"), Limit(name="tenant:3")])  # as after a first use
    dialect = get_dialect("default")
    dialect.bound_waits(3.0, 11.0)
    try:
        with CaptureQueriesContext(connection) as queries:
            claimed = leases.claim(dialect, owner="w", queues=[], limit=10, lease_ttl=60,
                                   fair_share=FairShare(conf.get()))  # fmt: skip
    finally:
        vars(connection).pop("_jobqueue_waits", None)
        vars(connection).pop("_jobqueue_bound_waits", None)
    assert len(claimed) == 2
    sqls = [q["sql"] for q in queries.captured_queries]
    [bounds] = [sql for sql in sqls if "set_config('lock_timeout'" in sql]
    # The BEGIN, the bounds and the transaction's first statement: one query.
    assert bounds.startswith("BEGIN; SELECT set_config('lock_timeout', '3000ms', true), set_")
    assert "; SELECT " in bounds
    [lock] = [sql for sql in sqls if '"django_jobqueue_limit"' in sql and "FOR UPDATE" in sql]
    assert "; SELECT uses FROM" in lock
    [mark] = [sql for sql in sqls if sql.startswith('UPDATE "django_jobqueue_job"')]
    assert mark.endswith("; COMMIT")  # nothing follows the marking in the claim's transaction


def test_rate_limited_on_a_resource_no_limit_governs_holds_back_only_its_job(caplog):
    limited = jobqueue.enqueue(
        "limits.rate_limited_once", {"resource": "elsewhere", "retry_after": 30}, max_attempts=1
    )
    other = work(uses={"api": 1})
    dialect, settings = get_dialect("default"), conf.get()
    [claimed] = leases.claim(dialect, owner="w", queues=[], limit=1, lease_ttl=60,
                             fair_share=FairShare(settings))  # fmt: skip
    flight = attempts.InFlight(
        job=claimed, lease=leases.Lease(claimed.pk, "w", claimed.attempts), claimed=0.0
    )
    outcomes.record(dialect, settings, "w", [attempts.run(dialect, settings, flight)])
    assert "no entry of JOBQUEUE['LIMITS'] governs this resource" in caplog.text
    assert Job.objects.get(pk=limited.pk).state == "scheduled"
    assert claim() == [other.pk]


# -- jobqueue_limits --------------------------------------------------------------------------


def limits_json() -> dict:
    out = StringIO()
    call_command("jobqueue_limits", "--json", stdout=out)
    return {e["name"]: e for e in json.loads(out.getvalue())["limits"]}


def test_the_command_lists_occupancy_and_changes_a_limit_live():
    [work(uses={"tenant:1": 1}) for _ in range(3)]
    work(uses={"tokens": 30})
    claim()
    shown = limits_json()
    assert shown["tenant:1"] == {
        "name": "tenant:1",
        "limit": "tenant:*",
        "concurrency": 1,
        "rate": None,
        "in_flight": 1,
        "started_in_window": None,
        "granted_in_window": None,
        "settled_in_window": None,
        "closed_until": None,
        "waiting": 2,
        "changed": False,
        "settings": {"concurrency": 1, "rate": None},
        "declared_by": "LIMITS",
    }
    assert shown["tokens"]["started_in_window"] == 30 and shown["tokens"]["rate"] == "100/s"
    assert shown["api"]["in_flight"] == 0  # configured, never used
    work(uses={"tenant:2": 1})  # waiting, never claimed: listed all the same
    assert limits_json()["tenant:2"]["waiting"] == 1
    assert limits_json()["tenant:*"]["waiting"] == 3
    call_command("jobqueue_limits", "set", "tenant:*", "--concurrency", "3", stdout=StringIO())
    assert limits_json()["tenant:1"]["concurrency"] == 3
    assert limits_json()["tenant:1"]["changed"] is True
    text = StringIO()
    call_command("jobqueue_limits", stdout=text)
    assert "tenant:* (changed)" in text.getvalue()
    call_command("jobqueue_limits", "reset", "tenant:*", stdout=StringIO())
    assert limits_json()["tenant:1"]["concurrency"] == 1


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["set", "nope", "--concurrency", "1"], "not a limit"),
        (["set", "api"], "Give --concurrency"),
        (["set", "api", "--concurrency", "0"], "concurrency"),
        (["set", "api", "--rate", "5/w"], "N/s"),
        (["set", "bad\x1bname", "--concurrency", "1"], "control characters"),
        (["reset", "nope"], "not a limit"),
    ],
)
def test_the_command_refuses_bad_changes(argv, match):
    with pytest.raises(CommandError, match=match):
        call_command("jobqueue_limits", *argv, stdout=StringIO())


def test_a_change_keeps_what_it_does_not_name(settings):
    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "LIMITS": {**LIMITS, "api": {"concurrency": 2, "rate": "10/s"}},
    }
    call_command("jobqueue_limits", "set", "api", "--rate", "20/s", stdout=StringIO())
    assert (limits_json()["api"]["concurrency"], limits_json()["api"]["rate"]) == (2, "20/s")
    call_command("jobqueue_limits", "set", "api", "--concurrency", "4", stdout=StringIO())
    assert (limits_json()["api"]["concurrency"], limits_json()["api"]["rate"]) == (4, "20/s")
    call_command("jobqueue_limits", "set", "tenant:9", "--concurrency", "2", stdout=StringIO())
    assert limits_json()["tenant:9"]["concurrency"] == 2  # one tenant, over its pattern's 1
    assert limits_json()["tenant:*"]["concurrency"] == 1


def test_a_live_change_applies_to_the_next_claims():
    jobs = [work(uses={"tenant:5": 1}) for _ in range(4)]
    assert claim() == [jobs[0].pk]
    call_command("jobqueue_limits", "set", "tenant:5", "--concurrency", "3", stdout=StringIO())
    assert claim() == [jobs[1].pk, jobs[2].pk]  # a fresh worker reads the change at once


def test_limits_without_entries_in_settings_hold_back_nothing(settings):
    job = work(uses={"api": 1})
    settings.JOBQUEUE = {**settings.JOBQUEUE, "LIMITS": {}}
    assert claim() == [job.pk]  # a resource LIMITS no longer names has no limit


def test_the_stats_show_a_closed_resource():
    from django_jobqueue.limits import resources as quotas

    quotas.close(get_dialect("default"), "api", 60)
    out = StringIO()
    call_command("jobqueue_stats", "--json", stdout=out)
    assert list(json.loads(out.getvalue())["closed_resources"]) == ["api"]
    text = StringIO()
    call_command("jobqueue_stats", stdout=text)
    assert "Closed by RateLimited: api until " in text.getvalue()


def test_the_time_to_look_again_for_a_full_rate_is_cleared_by_the_next_claims(
    settings, monkeypatch
):
    """A claim that found a rate's window full says when to look again; claims after that
    time that find the window with room say nothing. (It was never cleared: the dispatcher
    then waited for nothing, and an idle worker claimed in a loop.)"""
    settings.JOBQUEUE = {**settings.JOBQUEUE, "LIMITS": {"tokens": {"rate": "2/s"}}}
    [work(uses={"tokens": 1}) for _ in range(3)]
    fair_share, dialect = FairShare(conf.get()), get_dialect("default")
    from django_jobqueue.limits import resources as quotas

    monkeypatch.setattr(quotas, "HELD_FOR", 0.0)  # each claim looks at the window

    def take() -> int:
        return len(leases.claim(dialect, owner="w", queues=[], limit=10, lease_ttl=60,
                                fair_share=fair_share))  # fmt: skip

    assert take() == 2
    assert take() == 0  # the window is full: look again when its first start leaves it
    retry_at = fair_share.retry_at()
    assert retry_at is not None and retry_at > time.monotonic()
    time.sleep(max(0.0, retry_at - time.monotonic()) + 0.05)
    deadline = time.monotonic() + 30
    while take() == 0:  # the window has room again: the third job starts
        assert time.monotonic() < deadline
    take()  # nothing left to start, and no full window
    assert fair_share.retry_at() is None


def test_the_command_lists_the_group_queue_and_rate_limits_as_resources(settings):
    """GROUP_LIMITS, RATE_LIMITS and QUEUE_LIMITS are resources of the one engine: listed
    beside LIMITS' ("group:<name>", "queue:<name>"), with what they hold, and changed live."""
    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "GROUP_LIMITS": {"exports": 2},
        "RATE_LIMITS": {"exports": "10/s", "mail": "60/m"},
        "QUEUE_LIMITS": {"slow": 1},
    }
    [work(group="exports") for _ in range(3)]
    work(queue="slow")
    claim()
    shown = limits_json()
    exports = shown["group:exports"]
    assert (exports["concurrency"], exports["rate"], exports["in_flight"]) == (2, "10/s", 2)
    assert (exports["waiting"], exports["started_in_window"]) == (1, 2)
    assert exports["declared_by"] == "GROUP_LIMITS, RATE_LIMITS"
    assert shown["group:mail"]["rate"] == "60/m" and shown["group:mail"]["in_flight"] == 0
    assert shown["queue:slow"]["in_flight"] == 1
    assert shown["queue:slow"]["declared_by"] == "QUEUE_LIMITS"
    call_command("jobqueue_limits", "set", "group:exports", "--concurrency", "3", stdout=StringIO())
    assert limits_json()["group:exports"]["concurrency"] == 3
    assert len(claim()) == 1  # the raised cap, applied by the next claims
    call_command("jobqueue_limits", "reset", "group:exports", stdout=StringIO())
    assert limits_json()["group:exports"]["concurrency"] == 2


@pytest.mark.parametrize(
    ("extra", "entry"),
    [
        ({"GROUP_LIMITS": {"exports": 2}}, "group:exports"),
        ({"RATE_LIMITS": {"exports": "5/s"}}, "group:*"),
        ({"QUEUE_LIMITS": {"slow": 1}}, "queue:slow"),
    ],
)
def test_a_limits_entry_may_not_govern_a_derived_resource(settings, extra, entry):
    """ "group:<name>" and "queue:<name>" are the resources GROUP_LIMITS, RATE_LIMITS and
    QUEUE_LIMITS derive: a LIMITS entry that governs one would count its jobs twice."""
    settings.JOBQUEUE = {**settings.JOBQUEUE, **extra, "LIMITS": {entry: {"concurrency": 1}}}
    messages = [m for m in run_checks() if m.id == "django_jobqueue.E001"]
    assert messages and "give that limit in one place" in messages[0].msg
