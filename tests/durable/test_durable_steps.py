"""Durable steps, sleeps, events, children and progress, through `testing.run_jobs()` (the
worker's own claim, run and record functions, in this thread). The same with real worker
processes, crashes and limits: tests/durable/test_durable_workers.py."""

from __future__ import annotations

import datetime as dt
import re
import time
from pathlib import Path

import pytest
from django.utils import timezone

import django_jobqueue as jobqueue
from django_jobqueue.exceptions import InvalidJobError, WaitTimeout
from django_jobqueue.models import Job, JobEvent, JobStep, JobWait
from django_jobqueue.testing import RunawayJobsError, run_jobs
from tests.conftest import poll
from tests.testapp.durable_jobs import lines, send_in_transaction
from tests.testapp.models import Order

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def marker(tmp_path: Path) -> str:
    return str(tmp_path / "calls")


def refreshed(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


# -- steps -------------------------------------------------------------------------------------


def test_steps_done_before_a_failure_are_not_run_again(marker):
    job = jobqueue.enqueue("durable.loop_steps", {"marker": marker, "pages": 4, "fail_at": 2})
    run_jobs()
    job = refreshed(job)
    assert job.state == Job.State.DONE and job.attempts == 2
    # Pages 0 and 1 ran in the first attempt only; the retry got them from their records.
    assert lines(marker) == ["page0", "page1", "page2", "page3"]
    assert job.result == [{"page": n, "items": [n, n + 1]} for n in range(4)]
    steps = JobStep.objects.filter(job=job).order_by("seq")
    assert [(s.name, s.seq, s.attempt) for s in steps] == [
        ("page", 1, 1),
        ("page", 2, 1),
        ("page", 3, 2),
        ("page", 4, 2),
    ]


def test_a_step_returns_what_its_record_will(marker):
    """The first run gets the result as JSON gives it back, as every later run will."""
    job = jobqueue.enqueue("durable.loop_steps", {"marker": marker, "pages": 1})
    run_jobs()
    assert refreshed(job).result == [{"page": 0, "items": [0, 1]}]  # the tuple is a list


def test_the_writes_of_a_step_that_raises_roll_back():
    job = jobqueue.enqueue("durable.writing_step", {"number": "A-1", "fail": True})
    run_jobs()
    job = refreshed(job)
    assert job.state == Job.State.DONE and job.attempts == 2
    assert Order.objects.filter(number="A-1").count() == 1
    assert job.result == Order.objects.get(number="A-1").pk


def test_the_writes_of_a_step_happen_once():
    """The first attempt fails after its step: the retry gets the step's record."""
    job = jobqueue.enqueue("durable.writing_step", {"number": "B-1", "fail_after": True})
    run_jobs()
    job = refreshed(job)
    assert job.state == Job.State.DONE and job.attempts == 2
    assert Order.objects.filter(number="B-1").count() == 1
    assert job.result == Order.objects.get(number="B-1").pk


def test_a_step_result_that_cannot_be_stored_kills_the_job():
    job = jobqueue.enqueue("durable.bad_step", max_attempts=3)
    run_jobs()
    job = refreshed(job)
    assert job.state == Job.State.DEAD and job.attempts == 1
    assert "cannot store its result" in job.last_error["message"]
    assert not JobStep.objects.filter(job=job).exists()


@pytest.mark.parametrize("name", ["", "@mine", "x" * 201, "tab\there"])
def test_bad_step_names_are_refused(name):
    from django_jobqueue.engine import durable

    with pytest.raises(InvalidJobError):
        durable.run(durable.step_plan(None, name, print, (), {}))  # type: ignore[arg-type]


# -- sleeps ------------------------------------------------------------------------------------


def test_a_sleep_suspends_the_job_without_using_an_attempt():
    # 2 s: a shorter sleep could come due within run_jobs()'s own pass on a loaded machine.
    job = jobqueue.enqueue("durable.sleeper", {"seconds": 2}, max_attempts=1)
    run_jobs(ignore_delays=False)
    job = refreshed(job)
    assert job.state == Job.State.SCHEDULED
    assert (job.lease_owner, job.attempts) == (None, 0)
    time.sleep(2.1)
    run_jobs(ignore_delays=False)
    job = refreshed(job)
    assert job.state == Job.State.DONE and job.attempts == 1
    assert job.result >= 2


def test_sleep_until_suspends_until_that_time_and_sleeps_use_no_attempt():
    """Three sleeps, then a sleep until a given time: the job is `scheduled` until exactly
    then, holding nothing, and with max_attempts=1 still ends done."""
    until = timezone.now().replace(microsecond=0) + dt.timedelta(hours=1)
    job = jobqueue.enqueue("durable.naps", {"count": 3, "until": until.isoformat()},
                           max_attempts=1)  # fmt: skip

    def at_the_last_sleep() -> bool:
        run_jobs(ignore_delays=False)  # the short naps come due in turn
        row = refreshed(job)
        return row.state == Job.State.SCHEDULED and row.run_after == until

    poll(at_the_last_sleep, timeout=30, interval=0.02)
    row = refreshed(job)
    assert (row.lease_owner, row.attempts) == (None, 0)
    run_jobs()  # ignore_delays: the hour is over at once
    done = refreshed(job)
    assert (done.state, done.attempts, done.result) == (Job.State.DONE, 1, 3)


def test_cancelling_a_sleeping_job_cancels_it_at_once():
    job = jobqueue.enqueue("durable.sleeper", {"seconds": 3600})
    run_jobs(ignore_delays=False)
    assert refreshed(job).state == Job.State.SCHEDULED
    assert jobqueue.cancel(job) is True
    assert refreshed(job).state == Job.State.CANCELLED
    run_jobs()
    assert refreshed(job).state == Job.State.CANCELLED


def test_run_jobs_skips_sleeps_with_ignore_delays():
    job = jobqueue.enqueue("durable.sleeper", {"seconds": 3600}, max_attempts=1)
    run_jobs()
    assert refreshed(job).state == Job.State.DONE


# -- events ------------------------------------------------------------------------------------


def test_a_rolled_back_send_wakes_nothing_and_a_committed_one_gives_its_payload():
    job = jobqueue.enqueue("durable.waiter", {"key": "approval:1"}, max_attempts=1)
    run_jobs()
    assert refreshed(job).state == Job.State.WAITING
    assert JobWait.objects.filter(job_id=job.pk, key="approval:1").exists()
    send_in_transaction("approval:1", {"by": "ann"}, rollback=True)
    assert refreshed(job).state == Job.State.WAITING
    send_in_transaction("approval:1", {"by": "bob"}, rollback=False)
    assert refreshed(job).state == Job.State.READY
    run_jobs()
    job = refreshed(job)
    assert job.state == Job.State.DONE and job.attempts == 1
    assert job.result == {"payload": {"by": "bob"}}
    assert not JobWait.objects.filter(job_id=job.pk).exists()


def test_an_event_sent_before_the_wait_is_received_and_the_first_payload_kept():
    assert jobqueue.send_event("early", [1]) is True
    assert jobqueue.send_event("early", [2]) is False  # the first payload is kept
    job = jobqueue.enqueue("durable.waiter", {"key": "early"})
    run_jobs()
    assert refreshed(job).result == {"payload": [1]}
    assert JobEvent.objects.get(key="early").payload == [1]


def test_a_wait_that_times_out_raises_in_the_resumed_handler():
    job = jobqueue.enqueue("durable.waiter", {"key": "never", "timeout": 2}, max_attempts=1)
    run_jobs()
    assert refreshed(job).state == Job.State.WAITING
    time.sleep(2.1)
    run_jobs()
    job = refreshed(job)
    assert job.state == Job.State.DONE and job.result == "timed out"
    jobqueue.send_event("never", 1)  # too late: nothing waits any more
    assert refreshed(job).state == Job.State.DONE


def test_wait_timeout_is_importable_from_the_package():
    assert jobqueue.WaitTimeout is WaitTimeout


def test_cancelling_a_waiting_job_cancels_it_at_once():
    job = jobqueue.enqueue("durable.waiter", {"key": "k"})
    run_jobs()
    assert jobqueue.cancel(job) is True
    assert refreshed(job).state == Job.State.CANCELLED
    jobqueue.send_event("k")
    assert refreshed(job).state == Job.State.CANCELLED


# -- children ----------------------------------------------------------------------------------


def test_a_parent_waits_for_the_children_it_spawned(marker):
    parent = jobqueue.enqueue("durable.spawner", {"count": 3, "marker": marker}, max_attempts=1)
    after = jobqueue.enqueue("test.noop", depends_on=[parent])
    run_jobs()
    parent = refreshed(parent)
    assert parent.state == Job.State.DONE
    assert parent.result == [0, 1, 4]
    assert sorted(lines(marker)) == ["child0", "child1", "child2"]
    children = Job.objects.filter(parent_id=parent.pk)
    assert sorted(children.values_list("state", flat=True)) == ["done"] * 3
    assert refreshed(after).state == Job.State.DONE


def test_wait_for_raises_upstream_failed_when_a_child_ends_dead():
    parent = jobqueue.enqueue("durable.child_fails_waiter", max_attempts=1)
    run_jobs()
    done = refreshed(parent)
    assert done.state == Job.State.DONE and done.attempts == 1
    assert set(done.result) == {"failed"}
    failing, fine = Job.objects.filter(parent_id=parent.pk).order_by("pk")
    assert (failing.state, fine.state) == (Job.State.DEAD, Job.State.DONE)
    assert str(failing.pk) in done.result["failed"]


def test_spawn_takes_the_handler_key_as_key_or_as_type():
    parent = jobqueue.enqueue("durable.spawn_by_keyword")
    refused = jobqueue.enqueue("durable.spawn_by_keyword", {"both": True}, max_attempts=1)
    run_jobs()
    assert refreshed(parent).state == Job.State.DONE
    assert refreshed(parent).result == [1, 4]
    assert list(Job.objects.filter(parent_id=parent.pk).values_list("type", flat=True)) == [
        "durable.child",
        "durable.child",
    ]
    refused = refreshed(refused)
    assert refused.state == Job.State.DEAD
    assert refused.last_error["type"].endswith("InvalidJobError")
    assert "once" in refused.last_error["message"]


def test_a_parent_that_does_not_wait_is_done_once_its_children_are():
    parent = jobqueue.enqueue("durable.spawner", {"count": 2, "wait": False})
    after = jobqueue.enqueue("test.noop", depends_on=[parent])
    with pytest.raises(RunawayJobsError):  # the parent only: its children are still ready
        run_jobs(max_runs=1)
    parent = refreshed(parent)
    assert parent.state == Job.State.WAITING and parent.sealed
    assert refreshed(after).state == Job.State.WAITING
    run_jobs()
    assert refreshed(parent).state == Job.State.DONE
    assert refreshed(parent).result == sorted(
        Job.objects.filter(parent_id=parent.pk).values_list("pk", flat=True)
    )
    assert refreshed(after).state == Job.State.DONE


def test_what_depends_on_a_job_waits_for_the_jobs_its_children_spawned_too():
    """Recursively: a job spawns a child that spawns two grandchildren without waiting for
    them; the job depending on the top one starts only once the grandchildren are done."""
    top = jobqueue.enqueue(
        "durable.spawn_and_wait", {"children": [["durable.spawner", {"count": 2, "wait": False}]]}
    )
    after = jobqueue.enqueue("test.noop", depends_on=[top])
    with pytest.raises(RunawayJobsError):  # top, then its child: the grandchildren are ready
        run_jobs(max_runs=3)
    [child] = Job.objects.filter(parent_id=top.pk)
    grandchildren = list(Job.objects.filter(parent_id=child.pk))
    assert len(grandchildren) == 2
    assert refreshed(after).state == Job.State.WAITING
    run_jobs()
    finished = max(refreshed(g).finished_at for g in grandchildren)
    after, top = refreshed(after), refreshed(top)
    assert after.state == top.state == Job.State.DONE
    assert after.started_at >= finished


def test_progress_is_recorded_and_read_back():
    job = jobqueue.enqueue("durable.progressing", {"steps": 5})
    run_jobs()
    progress = refreshed(job).progress
    assert {k: progress[k] for k in ("current", "total", "message")} == {
        "current": 5,
        "total": 5,
        "message": "page 5 of 5",
    }
    assert progress["updated_at"]


def test_progress_is_written_at_most_about_once_a_second_and_when_the_run_ends():
    """200 calls in well under a second: the first is written at once, the last when the run
    ends, none between (the write is throttled, one UPDATE of the job's row each)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    job = jobqueue.enqueue("durable.progressing", {"steps": 200})
    with CaptureQueriesContext(connection) as queries:
        run_jobs()
    progress = re.compile(r"^UPDATE .* SET [`\"]progress[`\"] =")
    writes = [q["sql"] for q in queries.captured_queries if progress.match(q["sql"])]
    assert 1 <= len(writes) <= 3, writes  # the first, the last, and one a second between
    assert refreshed(job).progress["current"] == 200


# -- records read with the claim ---------------------------------------------------------------


def test_a_worker_reads_the_claimed_jobs_records_in_one_query(monkeypatch):
    """`durable.preload`: the records a resumed run would read, for every claimed job that has
    some, in one query; a job whose rows the cap may have cut reads its own at its run."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_jobqueue.dialects import get_dialect
    from django_jobqueue.dialects.base import read_json
    from django_jobqueue.engine import durable, leases, replay

    one, two, plain = (jobqueue.enqueue("test.noop") for _ in range(3))
    Job.objects.filter(pk__in=[one.pk, two.pk]).update(has_steps=True)
    JobStep.objects.create(job_id=one.pk, name="fetch", seq=1, result={"page": 1}, attempt=1)
    JobStep.objects.create(job_id=two.pk, name="fetch", seq=1, result=[1, "a"], attempt=1)
    JobStep.objects.create(job_id=two.pk, name="@sleep", seq=1, result=None, attempt=1)
    dialect = get_dialect(connection.alias)
    claimed = leases.claim(dialect, owner="w", queues=[], limit=3, lease_ttl=30)
    with CaptureQueriesContext(connection) as queries:
        durable.preload(dialect, claimed)
    assert len(queries) == 1

    def decoded(records):  # as read, the results are decoded at their first use
        if records is None:
            return None
        return {key: read_json(stored.value) for key, stored in records.items()}

    records = {job.id: decoded(job.records) for job in claimed}
    assert records == {
        one.pk: {("fetch", 1): {"page": 1}},
        two.pk: {("fetch", 1): [1, "a"], ("@sleep", 1): None},
        plain.pk: None,  # no records: its run needs no read
    }
    [resumed] = [job for job in claimed if job.id == two.pk]
    calls = durable.Calls(dialect, two.pk, True, resumed.records)
    assert calls.next("fetch") == (1, [1, "a"])
    assert calls.next("@sleep", decode=False)[1] is not durable.MISSING
    # At most PRELOAD_ROWS a job on average: the read of 2 jobs stops at 3 rows, and the
    # job of the last row read (maybe cut short) reads its own.
    monkeypatch.setattr(replay, "PRELOAD_ROWS", 1)
    for job in claimed:
        job.records = None
    durable.preload(dialect, claimed)
    assert {job.id: decoded(job.records) for job in claimed} == {
        one.pk: {("fetch", 1): {"page": 1}},
        two.pk: None,
        plain.pk: None,
    }


def test_the_records_of_a_large_claim_are_read_in_one_query_each_time():
    """A claim of more resumed jobs than a statement's cached parameters (psycopg caches the
    parsing of statements of at most 50): one read each time, every record found."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_jobqueue.dialects import get_dialect
    from django_jobqueue.engine import durable, leases

    jobs = [jobqueue.enqueue("test.noop") for _ in range(70)]
    Job.objects.update(has_steps=True)
    JobStep.objects.bulk_create(
        JobStep(job_id=job.pk, name="@sleep", seq=1, result={"seconds": n}, attempt=1)
        for n, job in enumerate(jobs)
    )
    dialect = get_dialect(connection.alias)
    claimed = leases.claim(dialect, owner="w", queues=[], limit=70, lease_ttl=30)
    for _ in range(2):  # the second read uses the statement kept by the first
        for job in claimed:
            job.records = None
        with CaptureQueriesContext(connection) as queries:
            durable.preload(dialect, claimed)
        assert len(queries) == 1
        seconds = {
            job.id: durable.Calls(dialect, job.id, True, job.records).next("@sleep")[1]
            for job in claimed
        }
        assert seconds == {job.pk: {"seconds": n} for n, job in enumerate(jobs)}


@pytest.mark.parametrize("lost", ["reclaimed", "claimed-again"])
def test_a_step_whose_lease_is_gone_records_nothing_and_its_writes_roll_back(lost):
    """The step's record is fenced by the lease in its own statement: a job reclaimed (or
    reclaimed and claimed by another worker) meanwhile gets no record, and what the step's
    function wrote goes with it."""
    from django.db import connection

    from django_jobqueue import conf
    from django_jobqueue.dialects import get_dialect
    from django_jobqueue.engine import leases
    from django_jobqueue.engine.context import JobContext
    from django_jobqueue.exceptions import LeaseLost

    job = jobqueue.enqueue("test.noop")
    dialect = get_dialect(connection.alias)
    [claimed] = leases.claim(dialect, owner="w1", queues=[], limit=1, lease_ttl=30)
    ctx = JobContext(claimed.model(), claimed.attempts, "w1", 30.0, dialect,
                     _max_result_bytes=conf.get().max_result_bytes)  # fmt: skip
    assert ctx.step("first", lambda: 1) == 1  # the lease holds: recorded
    if lost == "reclaimed":
        Job.objects.filter(pk=job.pk).update(
            state=Job.State.READY, lease_owner=None, lease_expires=None
        )
    else:
        Job.objects.filter(pk=job.pk).update(lease_owner="w2", attempts=claimed.attempts + 1)

    def write() -> int:
        return int(Order.objects.create(number="C-1").pk)

    with pytest.raises(LeaseLost):
        ctx.step("second", write)
    assert list(JobStep.objects.filter(job=job).values_list("name", flat=True)) == ["first"]
    assert not Order.objects.filter(number="C-1").exists()


def test_a_batch_of_sleeps_is_suspended_and_what_cannot_be_is_told_apart():
    """The completer's batch of suspensions (one statement for plain sleeps on PostgreSQL, a
    transaction elsewhere and for the rest): a current lease is `scheduled` with its record,
    its attempt given back and its due time from the database's clock; a job whose
    cancellation was requested ends `cancelled`; a lease that is gone writes nothing; a
    zero-second sleep is `ready` at once."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_jobqueue.dialects import get_dialect
    from django_jobqueue.engine import leases, suspensions
    from django_jobqueue.exceptions import Suspend

    jobs = [jobqueue.enqueue("test.noop") for _ in range(5)]
    dialect = get_dialect(connection.alias)
    claimed = {c.id: c for c in leases.claim(dialect, owner="w1", queues=[], limit=5, lease_ttl=30)}
    assert set(claimed) == {job.pk for job in jobs}
    sleeping, other, cancelled, lost, now_ = (job.pk for job in jobs)
    Job.objects.filter(pk=cancelled).update(cancel_requested=True)
    Job.objects.filter(pk=lost).update(lease_owner="w2")

    def nap(pk: int, delay: float) -> tuple[leases.Lease, Suspend]:
        record = ("@sleep", 1, {"seconds": delay}, 1)
        return leases.Lease(pk, "w1", claimed[pk].attempts), Suspend(
            "sleep", delay=delay, records=[record]
        )

    before = dialect.now()
    with CaptureQueriesContext(connection) as queries:
        states = suspensions.suspend_many(
            dialect,
            [nap(sleeping, 60), nap(other, 120), nap(cancelled, 60), nap(lost, 60), nap(now_, 0)],
        )
    after = dialect.now()
    if connection.vendor == "postgresql":  # the plain sleeps in one statement, before the rest
        assert "moved AS (" in queries[0]["sql"]
        assert len([q for q in queries if "moved AS (" in q["sql"]]) == 1
    assert states == {sleeping: "scheduled", other: "scheduled", cancelled: "cancelled",
                      lost: None, now_: "ready"}  # fmt: skip
    for pk, delay in ((sleeping, 60), (other, 120)):
        row = Job.objects.get(pk=pk)
        assert (row.lease_owner, row.lease_expires, row.attempts, row.has_steps) == (
            None,
            None,
            0,
            True,
        )
        assert (
            before + dt.timedelta(seconds=delay)
            <= row.run_after
            <= after + dt.timedelta(seconds=delay)
        )
        step = JobStep.objects.get(job_id=pk)
        assert (step.name, step.seq, step.result, step.attempt) == (
            "@sleep",
            1,
            {"seconds": delay},
            1,
        )
    assert Job.objects.filter(pk=lost, lease_owner="w2", state__in=Job.LEASED_STATES).exists()
    assert not JobStep.objects.filter(job_id__in=[lost, cancelled]).exists()
