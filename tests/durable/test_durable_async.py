"""Durable calls in async handlers, in process: run_jobs() runs them as it runs sync ones, the
records are those a sync handler writes (either kind resumes the other's job), a plain
function's writes commit with its step's record, and the callers' async twins aenqueue() and
asend_event() behave as enqueue() and send_event()."""

from __future__ import annotations

from pathlib import Path

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import transaction

import django_jobqueue as jobqueue
from django_jobqueue.exceptions import InvalidArgumentsError, InvalidJobError, UnknownHandlerError
from django_jobqueue.models import Job, JobEvent, JobStep
from django_jobqueue.testing import run_jobs
from tests.testapp.durable_jobs import lines
from tests.testapp.models import Order

pytestmark = pytest.mark.django_db


@pytest.fixture
def marker(tmp_path: Path) -> str:
    return str(tmp_path / "calls")


def records(job: Job) -> list[tuple[str, int, object]]:
    """The job's records, as a replay reads them (name, call number, result), with the ids of
    the jobs a spawn or a wait names left out (they differ from job to job)."""
    rows = JobStep.objects.filter(job=job).order_by("name", "seq")
    found = []
    for row in rows:
        result = row.result
        if row.name == "@spawn":
            result = {**result, "job_id": "<child>"}
        elif row.name == "@wait":
            result = {"ids": len(result["ids"]), "states": sorted(result["states"].values())}
        found.append((row.name, row.seq, result))
    return found


def test_an_async_context_is_a_job_context():
    from django_jobqueue.engine.context import AsyncJobContext

    assert issubclass(AsyncJobContext, jobqueue.JobContext)
    assert jobqueue.AsyncJobContext is AsyncJobContext


@pytest.mark.parametrize("type", ["pipeline.sync", "pipeline.async"])
def test_run_jobs_runs_a_durable_handler_through_sleeps_events_and_children(type, marker):
    """Steps (async and plain functions), progress, a sleep (ignore_delays), an event sent
    between two run_jobs() calls, a spawned child waited for: the same for both kinds."""
    job = jobqueue.enqueue(type, {"marker": marker, "key": f"go-{type}"}, max_attempts=1)
    run_jobs()
    row = Job.objects.get(pk=job.pk)
    assert (row.state, row.lease_owner, row.attempts) == (Job.State.WAITING, None, 0)
    assert row.progress["message"] == "fetched"
    jobqueue.send_event(f"go-{type}", {"ok": True})
    report = run_jobs()
    row = Job.objects.get(pk=job.pk)
    assert (row.state, row.attempts) == (Job.State.DONE, 1), row.last_error
    assert row.result == {
        "pages": [{"page": 0, "items": [0, 1]}, {"page": 1, "items": [1, 2]}],
        "saved": f"order-go-{type}",
        "payload": {"ok": True},
        "child": 9,
    }
    assert row.progress["current"] == 3
    assert lines(marker) == ["fetch0", "fetch1"]  # the resumes replayed the fetches
    assert Order.objects.filter(number=f"order-go-{type}").count() == 1
    assert report.counts == {"done": 2}  # the job and its child


def test_sync_and_async_handlers_write_the_same_records_and_resume_each_other(marker):
    """A job begun by the sync pipeline and resumed by the async one (and the reverse) replays
    the other's records: no step runs again, and the records are those either writes alone."""
    jobqueue.send_event("go", 1)  # sent before: each run takes it at once
    alone = []
    for type in ("pipeline.sync", "pipeline.async"):
        job = jobqueue.enqueue(type, {"marker": marker, "key": "go"})
        run_jobs(ignore_delays=False)  # it stops at its sleep (the sleep is recorded)
        run_jobs()
        alone.append(records(job))
    assert alone[0] == alone[1]
    assert [name for name, _, _ in alone[0]] == [
        "@event", "@sleep", "@spawn", "@wait", "fetch", "fetch", "save"
    ]  # fmt: skip
    for first, then in (("pipeline.sync", "pipeline.async"), ("pipeline.async", "pipeline.sync")):
        Path(marker).unlink()
        job = jobqueue.enqueue(first, {"marker": marker, "key": "go"})
        run_jobs(ignore_delays=False)  # it stops at its sleep
        assert Job.objects.get(pk=job.pk).state == Job.State.SCHEDULED
        Job.objects.filter(pk=job.pk).update(type=then)  # a deploy swaps the handler
        run_jobs()
        row = Job.objects.get(pk=job.pk)
        assert (row.state, row.result["child"]) == (Job.State.DONE, 9), row.last_error
        assert lines(marker) == ["fetch0", "fetch1"]
        assert records(job) == alone[0]


def test_a_plain_functions_write_and_its_steps_record_commit_together(marker):
    """The write of a step's plain function and the step's record are in one transaction:
    rolled back together when the record cannot be written (its lease is gone)."""
    from django_jobqueue.dialects import get_dialect
    from django_jobqueue.engine.context import AsyncJobContext
    from django_jobqueue.exceptions import LeaseLost

    job = jobqueue.enqueue("test.noop")
    ctx = AsyncJobContext(job, 1, "not-the-owner", 30.0, get_dialect("default"))

    async def step() -> int:
        return await ctx.step("write", lambda: Order.objects.create(number="lost").pk)

    with pytest.raises(LeaseLost):
        async_to_sync(step)()
    assert not Order.objects.filter(number="lost").exists()
    assert not JobStep.objects.filter(job=job).exists()


def test_the_records_of_steps_taken_at_once_are_written_together_each_fenced(monkeypatch):
    """Async steps of several jobs on one loop: their records are written in batches; a job
    whose lease is gone gets LeaseLost, a record the database refuses fails only its own step
    (the batch is written again record by record), and the others are recorded."""
    import asyncio

    from django_jobqueue.engine import durable, leases
    from django_jobqueue.engine.context import AsyncJobContext
    from django_jobqueue.exceptions import LeaseLost
    from django_jobqueue.testing.runner import testing_dialect

    dialect = testing_dialect("default")
    for _ in range(4):
        jobqueue.enqueue("test.noop")
    claimed = leases.claim(dialect, owner="w", queues=[], limit=4, lease_ttl=60)
    good, gone, clash, other = (
        AsyncJobContext(job, job.attempts, "other-worker" if n == 1 else "w", 60.0, dialect)
        for n, job in enumerate(claimed)
    )
    JobStep.objects.create(job_id=clash.job_id, name="s", seq=1, result=0, attempt=1)
    batches = []
    write_records = durable.write_records
    monkeypatch.setattr(durable, "write_records", lambda records, outcomes: batches.append(
        len(records)) or write_records(records, outcomes))  # fmt: skip

    async def step(ctx: AsyncJobContext, value: int) -> object:
        async def fn() -> int:
            await asyncio.sleep(0.01)  # they all wait for their records at once
            return value

        try:
            return await ctx.step("s", fn)
        except Exception as exc:
            return type(exc)

    def together(*steps: tuple[AsyncJobContext, int]) -> list[object]:
        async def gather() -> list[object]:
            return await asyncio.gather(*(step(ctx, value) for ctx, value in steps))

        return async_to_sync(gather)()

    assert together((good, 0), (gone, 1), (other, 2)) == [0, LeaseLost, 2]
    # The first record is written at once, those that came meanwhile together after it.
    assert sum(batches) == 3 and len(batches) < 3, batches
    good._calls = durable.Calls(dialect, good.job_id)  # the job's next run: its step is recorded
    assert together((good, 5)) == [0]
    assert sum(batches) == 3
    refused, fine = together((clash, 5), (good, 7))
    assert refused not in (5, LeaseLost) and issubclass(refused, Exception)  # the clash
    assert fine == 7
    rows = JobStep.objects.filter(name="s")
    assert sorted((r.job_id, r.seq, r.result) for r in rows) == sorted(
        [(good.job_id, 1, 0), (other.job_id, 1, 2), (clash.job_id, 1, 0), (good.job_id, 2, 7)]
    )


# -- the callers' async twins ---------------------------------------------------------------


def test_aenqueue_enqueues_as_enqueue_does():
    job = async_to_sync(jobqueue.aenqueue)("test.add", {"a": 1, "b": 2}, priority=5)
    row = Job.objects.get(pk=job.pk)
    assert (row.type, row.args, row.priority, row.state) == ("test.add", {"a": 1, "b": 2}, 5,
                                                             Job.State.READY)  # fmt: skip


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("no.such_handler",), UnknownHandlerError),
        (("test.add", {"a": {1, 2}}), InvalidArgumentsError),
        (("test.add", {"a": 1}, {"priority": 2**40}), InvalidJobError),
    ],
)
def test_aenqueue_refuses_what_enqueue_refuses_with_the_same_error(args, error):
    type, *rest = args
    arguments = rest[0] if rest else None
    options = rest[1] if len(rest) > 1 else {}
    with pytest.raises(error) as sync:
        jobqueue.enqueue(type, arguments, **options)
    with pytest.raises(error) as awaited:
        async_to_sync(jobqueue.aenqueue)(type, arguments, **options)
    assert str(awaited.value) == str(sync.value)
    assert not Job.objects.exists()


def test_asend_event_sends_as_send_event_does():
    waiting = jobqueue.enqueue("durable.waiter", {"key": "k"})
    run_jobs()
    assert Job.objects.get(pk=waiting.pk).state == Job.State.WAITING
    assert async_to_sync(jobqueue.asend_event)("k", {"n": 1}) is True
    assert async_to_sync(jobqueue.asend_event)("k", {"n": 2}) is False  # the first is kept
    run_jobs()
    assert Job.objects.get(pk=waiting.pk).result == {"payload": {"n": 1}}
    with pytest.raises(InvalidJobError) as sync:
        jobqueue.send_event("tab\there")
    with pytest.raises(InvalidJobError) as awaited:
        async_to_sync(jobqueue.asend_event)("tab\there")
    assert str(awaited.value) == str(sync.value)
    with pytest.raises(InvalidArgumentsError):
        async_to_sync(jobqueue.asend_event)("fine", {1, 2})
    assert not JobEvent.objects.filter(key__in=["fine", "tab\there"]).exists()


@pytest.mark.parametrize("rollback", [True, False])
def test_aenqueue_and_asend_event_join_a_transaction_opened_through_sync_to_async(rollback):
    """Opened by sync_to_async on the thread the async twins use too, a transaction holds
    their writes: they commit or roll back with it."""

    async def scenario() -> int:
        atomic = transaction.atomic()
        await sync_to_async(atomic.__enter__)()
        try:
            await sync_to_async(Order.objects.create)(number="with-the-job")
            job = await jobqueue.aenqueue("test.add", {"a": 1, "b": 2})
            await jobqueue.asend_event("with-the-job", 1)
            if rollback:
                await sync_to_async(transaction.set_rollback)(True)
        finally:
            await sync_to_async(atomic.__exit__)(None, None, None)
        return int(job.pk)

    pk = async_to_sync(scenario)()
    assert Job.objects.filter(pk=pk).exists() is not rollback
    assert Order.objects.filter(number="with-the-job").exists() is not rollback
    sent = JobEvent.objects.filter(key="with-the-job", sent_at__isnull=False).exists()
    assert sent is not rollback
