"""Budgets across worker processes: every call of a job takes units of a shared rate while it
runs (`ctx.acquire`) and settles what it used (`ctx.settle`); in every window the units used
stay within the rate, which the workers approach; a worker killed between a grant and its
settlement takes and settles nothing twice; a job without room holds no lease meanwhile."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

import django_jobqueue as jobqueue
from django_jobqueue.models import Job, JobStep, ResourceStart
from tests.conftest import assert_clean_log, poll, wait_for_job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

RATE = 2000  # tokens a second
LIMITS = {"tokens": {"rate": f"{RATE}/s"}, "daily:*": {"rate": "100/d"}, "other": {"rate": "100/s"}}
ENV = {"JOBQUEUE_TEST_LIMITS": json.dumps(LIMITS)}
FLEET = ("--concurrency", "8", "--poll-interval", "0.05")
SHORT_LEASE = ("--lease-ttl", "2", "--heartbeat-interval", "0.5", "--poll-interval", "0.05")


@pytest.fixture(autouse=True)
def limits(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "LIMITS": LIMITS}


def spends(job_ids: list[int]) -> list[tuple[float, int, int]]:
    """Each grant's (time, units granted, units used), from the jobs' records."""
    grants, settled = {}, {}
    for job_id, name, seq, result in JobStep.objects.filter(
        job_id__in=job_ids, name__in=["@acquire", "@settle"]
    ).values_list("job_id", "name", "seq", "result"):
        if name == "@acquire":
            at = dt.datetime.fromisoformat(result["granted_at"]).timestamp()
            grants[f"{job_id}:{seq}"] = (at, result["units"])
        else:
            settled[result["grant"]] = result["used"]
    return sorted((at, units, settled[key]) for key, (at, units) in grants.items())


def windows(rows: list[tuple[float, int, int]], length: float = 1.0):
    """For each grant, the window it opens: the units its grants used, and their excess over
    what they were granted."""
    for start, _, _ in rows:
        inside = [row for row in rows if start <= row[0] < start + length]
        yield sum(used for _, _, used in inside), sum(max(0, used - u) for _, u, used in inside)


def run_fleet(start_worker, jobs: list[Job]) -> None:
    fleet = [start_worker(*FLEET, env=ENV) for _ in range(3)]
    ids = [j.pk for j in jobs]
    poll(lambda: Job.objects.filter(pk__in=ids, state="done").count() == len(ids), timeout=240,
         interval=0.2)  # fmt: skip
    for worker in fleet:
        assert worker.stop() == 0, worker.output()
        assert_clean_log(worker.output())


@pytest.mark.parametrize("handler", ["budgets.acalls", "budgets.calls"], ids=["async", "sync"])
def test_budgets_hold_in_every_window(start_worker, handler):
    """3 workers; 24 jobs of 10 calls, each taking 100 tokens and settling 1 to 100 of them,
    under 2000 tokens a second: every call is granted and settled, and in every second the
    units used stay within 2000. How closely the workers approach the rate is a speed, which
    depends on the machine: bench.budgets --approach measures it (0.85-0.95 of the rate on an
    idle 2-core machine, the three databases; 0.74-0.87 at a load average of 10-13), and this
    test only prints it (a CI run on a loaded machine saw 0.33)."""
    jobs = [
        jobqueue.enqueue(handler, {"calls": 10, "estimate": 100, "spread": True}) for _ in range(24)
    ]
    run_fleet(start_worker, jobs)
    rows = spends([j.pk for j in jobs])
    assert len(rows) == 240
    most = max(used for used, _ in windows(rows))
    assert most <= RATE, most
    steady = rows[len(rows) // 10 : -len(rows) // 10]
    span = steady[-1][0] - steady[0][0]
    per_second = sum(used for _, _, used in steady) / span
    print(f"used {per_second:.0f} tokens/s of {RATE}; the most in any second {most}")


def test_a_settlement_above_its_grant_can_push_a_window_over_by_its_excess_only(start_worker):
    """The same with every third call using 150 of its 100: a window may go over the rate,
    but never by more than the excess of the settlements of its own grants."""
    jobs = [jobqueue.enqueue("budgets.calls", {"calls": 9, "estimate": 100, "used": 150})
            for _ in range(4)]  # fmt: skip
    jobs += [jobqueue.enqueue("budgets.calls", {"calls": 9, "estimate": 100, "used": 50})
             for _ in range(8)]  # fmt: skip
    run_fleet(start_worker, jobs)
    rows = spends([j.pk for j in jobs])
    for used, excess in windows(rows):
        assert used <= RATE + excess, (used, excess)


@pytest.mark.parametrize(
    ("hold", "seen"),
    [("hold", "granted 0"), ("hold_after", "settled 0")],
    ids=["before-settle", "give-back-unwritten"],
)
@pytest.mark.parametrize("handler", ["budgets.acalls", "budgets.calls"], ids=["async", "sync"])
def test_a_worker_killed_between_a_grant_and_its_settlement_takes_and_settles_once(
    start_worker, tmp_path: Path, handler, hold, seen
):
    """SIGKILL between the first grant and its settlement, or once its settlement returned
    but before it was written (one below its grant waits for the job's next round trip):
    the replay takes the grant and settles it once."""
    marker = str(tmp_path / "calls")
    job = jobqueue.enqueue(handler, {"resource": "daily:9", "calls": 2, "estimate": 10,
                                     "used": 4, "marker": marker, hold: 60},
                           max_attempts=3)  # fmt: skip
    doomed = start_worker(*SHORT_LEASE, env=ENV)
    poll(lambda: Path(marker).exists() and seen in Path(marker).read_text())
    doomed.kill()
    assert not ResourceStart.objects.filter(resource="daily:9", kind="settle").exists()
    Job.objects.filter(pk=job.pk).update(args={**job.args, hold: 0})  # no more holding
    start_worker(*SHORT_LEASE, env=ENV)
    done = wait_for_job(job.pk, Job.State.DONE, Job.State.DEAD, timeout=90)
    assert done.state == Job.State.DONE
    grants = ResourceStart.objects.filter(resource="daily:9", kind="grant")
    assert grants.count() == 2  # the first grant replayed from its record, not taken again
    settles = ResourceStart.objects.filter(resource="daily:9", kind="settle")
    assert sorted(settles.values_list("units", flat=True)) == [-6, -6]
    assert JobStep.objects.filter(job_id=job.pk, name="@settle").count() == 2
    assert [c["used"] for c in done.result] == [4, 4]


def test_a_job_without_room_holds_no_lease_while_others_run(start_worker):
    """ "daily:5" is spent for the day: its job waits `scheduled`, with no lease, while a job
    of another resource runs to the end beside it."""
    spent = jobqueue.enqueue("budgets.calls", {"resource": "daily:5", "estimate": 100})
    worker = start_worker(*FLEET, env=ENV)
    wait_for_job(spent.pk, Job.State.DONE, timeout=60)  # the day's 100 units, used
    blocked = jobqueue.enqueue("budgets.calls", {"resource": "daily:5", "estimate": 1})
    other = jobqueue.enqueue("budgets.calls", {"resource": "other", "calls": 3, "estimate": 10})
    wait_for_job(other.pk, Job.State.DONE, timeout=60)
    waiting = poll(lambda: (j := Job.objects.get(pk=blocked.pk)).state == "scheduled" and j)
    assert (waiting.lease_owner, waiting.attempts) == (None, 0)
    assert waiting.run_after > dt.datetime.now(dt.UTC) + dt.timedelta(hours=23)
    assert worker.stop() == 0


def test_a_give_back_is_never_written_inside_the_handlers_own_transaction(start_worker):
    """A settlement deferred to the job's next write is not written by a step inside the
    handler's atomic() block: that block rolls back, and the settlement with it would be lost
    (the job ends done and is never replayed). It is written outside, at the run's end."""
    job = jobqueue.enqueue("budgets.settle_then_rolled_back_step")
    start_worker(*FLEET, env=ENV)
    done = wait_for_job(job.pk, Job.State.DONE, Job.State.DEAD, timeout=60)
    assert done.state == Job.State.DONE, done.last_error
    records = list(JobStep.objects.filter(job_id=job.pk).values_list("name", "result"))
    settled = [result for name, result in records if name == "@settle"]
    assert len(settled) == 1, records
    assert not [name for name, _ in records if name == "save"]  # rolled back with its block
