"""Durable jobs with real worker processes: steps survive a SIGKILL, sleeps and waits give
back the slot and the job's place under its group's limit, spawned children run once however
their parent's worker dies, and a thousand sleeping jobs do not hold eight threads."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import django_jobqueue as jobqueue
from django_jobqueue.models import Job
from tests.conftest import poll, wait_for_job
from tests.support.workflow_support import FAST, limits_env, max_overlap, run_intervals
from tests.testapp.durable_jobs import lines, send_in_transaction
from tests.testapp.models import RunRecord

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# A short lease: a killed worker's jobs are reclaimed within seconds.
SHORT_LEASE = ("--lease-ttl", "2", "--heartbeat-interval", "0.5", *FAST)
LIMITED = limits_env(group_limits={"g": 2})


@pytest.fixture
def marker(tmp_path: Path) -> str:
    return str(tmp_path / "calls")


def test_a_worker_killed_in_the_third_step_runs_only_that_step_again(start_worker, marker):
    job = jobqueue.enqueue("durable.three_steps", {"marker": marker, "hold": 60}, max_attempts=3)
    doomed = start_worker(*SHORT_LEASE)
    poll(lambda: lines(marker) == ["one", "two", "three"])
    doomed.kill()  # SIGKILL inside the third step: its transaction rolls back
    start_worker(*SHORT_LEASE)
    done = wait_for_job(job.pk, Job.State.DONE, Job.State.DEAD, timeout=90)
    assert done.state == Job.State.DONE
    assert done.result == ["one-result", "two-result", "three-result"]
    assert done.attempts == 2
    assert lines(marker) == ["one", "two", "three", "three"]


def two_others() -> list[Job]:
    """Two 1 s jobs of group g, in one commit: a worker with room claims them together."""
    return jobqueue.enqueue_many(
        [{"type": "test.record", "args": {"sleep": 1.0}, "group": "g"}] * 2
    )


def others_ran_together_meanwhile(suspended: Job, others: list[Job]) -> None:
    """Both jobs of `others` (group g, limit 2) ran at once, while `suspended` held nothing."""
    ids = [o.pk for o in others]
    for pk in ids:
        wait_for_job(pk, Job.State.DONE, timeout=90)
    assert max_overlap(run_intervals(pk__in=ids)) == 2
    row = Job.objects.get(pk=suspended.pk)
    assert row.state in (Job.State.SCHEDULED, Job.State.WAITING), row.state
    assert (row.lease_owner, row.attempts) == (None, 0)


def test_a_sleeping_job_gives_back_its_place_under_the_group_limit(start_worker):
    # Long enough that the others run while it sleeps, on a loaded machine too.
    sleeper = jobqueue.enqueue("durable.sleeper", {"seconds": 12}, group="g", max_attempts=1)
    start_worker("--concurrency", "4", *FAST, env=LIMITED)
    poll(lambda: Job.objects.get(pk=sleeper.pk).state == Job.State.SCHEDULED)
    others = two_others()
    others_ran_together_meanwhile(sleeper, others)
    done = wait_for_job(sleeper.pk, Job.State.DONE, Job.State.DEAD, timeout=90)
    assert (done.state, done.attempts) == (Job.State.DONE, 1)
    assert done.result >= 12


def test_a_job_waiting_for_an_event_gives_back_its_place_and_survives_a_kill(start_worker):
    waiter = jobqueue.enqueue("durable.waiter", {"key": "go"}, group="g", max_attempts=1)
    first = start_worker("--concurrency", "4", *SHORT_LEASE, env=LIMITED)
    poll(lambda: Job.objects.get(pk=waiter.pk).state == Job.State.WAITING)
    others = two_others()
    others_ran_together_meanwhile(waiter, others)
    first.kill()  # a worker killed while the job waits: it holds nothing, so nothing changes
    time.sleep(1.0)
    assert Job.objects.get(pk=waiter.pk).state == Job.State.WAITING
    start_worker("--concurrency", "4", *SHORT_LEASE, env=LIMITED)
    jobqueue.send_event("go", {"n": 7})
    done = wait_for_job(waiter.pk, Job.State.DONE, Job.State.DEAD, timeout=90)
    assert (done.state, done.attempts, done.result) == (Job.State.DONE, 1, {"payload": {"n": 7}})


def test_events_reach_the_jobs_of_worker_processes_as_sent(start_worker):
    """With a worker process: a rolled-back send wakes nothing and a committed one wakes the
    job with its payload, an event sent before the wait is received, and a wait that times
    out (the worker's own promoter ends it) raises WaitTimeout in the resumed handler."""
    jobqueue.send_event("early", {"n": 1})  # before any job waits for it
    waiter = jobqueue.enqueue("durable.waiter", {"key": "approval"}, max_attempts=1)
    early = jobqueue.enqueue("durable.waiter", {"key": "early"}, max_attempts=1)
    timed = jobqueue.enqueue("durable.waiter", {"key": "never", "timeout": 2}, max_attempts=1)
    start_worker("--concurrency", "4", *FAST)
    done = wait_for_job(early.pk, Job.State.DONE, Job.State.DEAD, timeout=90)
    assert (done.state, done.result) == (Job.State.DONE, {"payload": {"n": 1}})
    poll(lambda: Job.objects.get(pk=waiter.pk).state == Job.State.WAITING)
    send_in_transaction("approval", {"by": "ann"}, rollback=True)
    done = wait_for_job(timed.pk, Job.State.DONE, Job.State.DEAD, timeout=90)
    assert (done.state, done.attempts, done.result) == (Job.State.DONE, 1, "timed out")
    # The worker has ended a 2 s wait since the rolled-back send: it woke nothing.
    assert Job.objects.get(pk=waiter.pk).state == Job.State.WAITING
    send_in_transaction("approval", {"by": "bob"}, rollback=False)
    done = wait_for_job(waiter.pk, Job.State.DONE, Job.State.DEAD, timeout=90)
    assert (done.state, done.attempts, done.result) == (
        Job.State.DONE,
        1,
        {"payload": {"by": "bob"}},
    )


def test_timeout_bounds_each_run_between_suspensions_not_the_whole_job(start_worker):
    """A job with a 3 s timeout works 1.5 s in each of three runs, sleeping between them:
    4.5 s of work in all, each run well inside its 3 s. It ends done on its one attempt."""
    job = jobqueue.enqueue(
        "durable.work_and_nap", {"runs": 3, "work": 1.5}, timeout=3, max_attempts=1
    )
    start_worker("--concurrency", "2", *FAST)
    done = wait_for_job(job.pk, Job.State.DONE, Job.State.DEAD, timeout=90)
    assert (done.state, done.attempts, done.result) == (Job.State.DONE, 1, 3), done.last_error
    took = (done.finished_at - done.first_started_at).total_seconds()
    assert took >= 4.5  # longer than the timeout: it bounds each run, not the job


def test_a_job_waiting_for_its_children_gives_back_its_place(start_worker):
    # The children wait for an event sent once the others have run: the parent still waits
    # for them then, however slowly a loaded machine ran the others.
    parent = jobqueue.enqueue(
        "durable.spawn_and_wait",
        {"children": [["durable.waiter", {"key": f"release-{n}"}] for n in range(2)]},
        group="g",
        max_attempts=1,
    )
    start_worker("--concurrency", "6", *FAST, env=LIMITED)
    poll(lambda: Job.objects.get(pk=parent.pk).state == Job.State.WAITING)
    others = two_others()
    others_ran_together_meanwhile(parent, others)
    for n in range(2):
        jobqueue.send_event(f"release-{n}", n)
    done = wait_for_job(parent.pk, Job.State.DONE, Job.State.DEAD, timeout=90)
    assert (done.state, done.attempts) == (Job.State.DONE, 1)
    assert sorted(result["payload"] for result in done.result.values()) == [0, 1]


def test_spawned_children_run_once_though_the_parents_worker_was_killed(start_worker, marker):
    """The parent spawns 5 children (their own queue and worker), its worker is killed before
    it waits; the retry spawns none again. A job after the parent starts only after the parent
    and every child are done."""
    parent = jobqueue.enqueue(
        "durable.spawn_and_wait",
        {
            "children": [["durable.child", {"i": i, "marker": marker}] for i in range(5)],
            "queue": "kids",
            "marker": marker,
            "hold": 60,
        },
        queue="parents",
        max_attempts=3,
    )
    after = jobqueue.enqueue("test.record", {"value": "after"}, queue="parents",
                             depends_on=[parent])  # fmt: skip
    doomed = start_worker(*SHORT_LEASE, "--queue", "parents")
    poll(lambda: "spawned" in lines(marker))
    doomed.kill()
    start_worker(*SHORT_LEASE, "--queue", "parents")
    start_worker(*SHORT_LEASE, "--queue", "kids")
    done = wait_for_job(after.pk, Job.State.DONE, Job.State.DEAD, Job.State.CANCELLED, timeout=90)
    assert done.state == Job.State.DONE
    parent = Job.objects.get(pk=parent.pk)
    assert parent.state == Job.State.DONE and parent.attempts == 2
    children = Job.objects.filter(parent_id=parent.pk)
    assert children.count() == 5
    assert sorted(c for c in lines(marker) if c.startswith("child")) == [
        f"child{i}" for i in range(5)
    ]
    assert sorted(parent.result.values()) == [0, 1, 4, 9, 16]
    last = max([parent.finished_at, *children.values_list("finished_at", flat=True)])
    assert done.started_at >= last
    assert RunRecord.objects.filter(job_id=after.pk).count() == 1


def test_a_thousand_sleeping_jobs_do_not_hold_eight_threads(start_worker):
    """1,000 jobs each sleep 3 s on 2 workers of 4 threads. Held as threads, the sleeps would
    take 375 s and no job would ever be seen `scheduled` (asleep) while it sleeps; suspended,
    many more than the 8 threads sleep at once, however slowly a loaded machine claims (at
    3 claims a second, 9 sleep at once)."""
    jobs = jobqueue.enqueue_many([("durable.sleeper", {"seconds": 3.0})] * 1000)
    started = time.monotonic()
    for _ in range(2):
        start_worker("--concurrency", "4", *FAST)
    sleeping_at_once = 0
    pending = Job.objects.filter(pk__in=[j.pk for j in jobs]).exclude(state=Job.State.DONE)
    while pending.exists():
        assert time.monotonic() - started < 300, "the sleeps held the threads"
        sleeping_at_once = max(
            sleeping_at_once, Job.objects.filter(state=Job.State.SCHEDULED).count()
        )
        time.sleep(0.05)
    elapsed = time.monotonic() - started
    print(f"1000 sleeping jobs done in {elapsed:.1f}s, {sleeping_at_once} asleep at once")
    assert sleeping_at_once > 8  # more than the threads could hold
    assert Job.objects.filter(pk__in=[j.pk for j in jobs], attempts=1).count() == 1000


def test_a_running_jobs_progress_shows_in_the_stats(start_worker):
    import json
    from io import StringIO

    from django.core.management import call_command

    job = jobqueue.enqueue("durable.progressing", {"steps": 40, "pause": 0.25})
    start_worker(*FAST)

    def shown() -> dict | None:
        out = StringIO()
        call_command("jobqueue_stats", "--json", stdout=out)
        running = json.loads(out.getvalue())["running"]
        return next((r for r in running if r["id"] == job.pk and r["progress"]), None)

    row = poll(shown)
    assert row["type"] == "durable.progressing"
    assert row["progress"]["total"] == 40 and 1 <= row["progress"]["current"] <= 40
    assert row["progress"]["message"].startswith("page ")
    done = wait_for_job(job.pk, Job.State.DONE, timeout=90)
    assert done.progress["current"] == 40  # the last value, written when the run ended
