"""Durable jobs: what a crash costs with steps, what a step and a sleep cost, and the claim
beside many suspended jobs.

`BENCH_DB=pg python -m bench.durable [--jobs 10000] [--suspended 100000]`

- `restart`: a job of 20 pieces of 0.1 s, its worker killed (SIGKILL) in piece 19; the time
  from its next claim to its end, as durable steps against plain calls (about 1/20).
- `recovery`: the peers' protocol for a crash (`../shared/bench-peers/DURABLE-PEERS.md`): a
  job of 20 durable steps of 0.1 s, its worker's process group killed (SIGKILL, the worker and
  its watchdog) in step 19, with the default `LEASE_TTL` (30 s); the seconds from the start of
  a new worker on the same host to the job's end (the new worker proves the old process gone
  and reclaims at once, `leases.md`, "How long recovery takes").
- `step_cost`: a step of a no-op function (its record, fenced by the lease, in its own
  transaction) against one `enqueue()` (target: below 2x).
- `sleep_drain`: the drain rate of jobs that each sleep once (suspend for 50 ms, resume)
  against jobs that don't, 2 workers at `--concurrency 8` (target: within 2x).
- `suspended_claim`: the median claim of 10 jobs in an empty table against one that also
  holds `--suspended` suspended jobs, half sleeping and half waiting for an event, each with
  a step record (target: about 1.0).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import time

from . import harness
from .claim_cost import claim_cost

KILL_LEASE = ["--lease-ttl", "2", "--heartbeat-interval", "0.5", "--poll-interval", "0.05"]


def killed_in_step_19(durable: bool, args: list[str]) -> int:
    """Enqueue a job of 20 pieces of 0.1 s (durable steps, or plain calls), start a worker
    with `args`, and kill its process group (SIGKILL) inside piece 19; return the job's id."""
    import django_jobqueue as jobqueue
    from django_jobqueue.models import Job

    harness.reset()
    job = jobqueue.enqueue("bench.steps", {"count": 20, "seconds": 0.1, "durable": durable})
    [first] = harness.start_workers(1, args)
    try:
        harness.wait_until(lambda: Job.objects.get(pk=job.pk).state == "running", 60, 0.005)
        time.sleep(1.85)  # inside piece 19 (of 0.1 s each)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(10)
    finally:
        harness.stop_workers([first])
    return job.pk


def restart(durable: bool) -> float:
    """Seconds from the reclaimed job's new claim to its end, its first worker killed in
    piece 19 of 20."""
    from django_jobqueue.models import Job

    pk = killed_in_step_19(durable, KILL_LEASE)
    second = harness.start_workers(1, KILL_LEASE)
    try:
        harness.wait_until(lambda: Job.objects.get(pk=pk).attempts == 2, 60, 0.005)
        started = time.perf_counter()
        harness.wait_until(lambda: Job.objects.get(pk=pk).state == "done", 60, 0.005)
        return time.perf_counter() - started
    finally:
        harness.stop_workers(second)


def recovery() -> float:
    """Seconds from a new worker's start to the end of a 20-step job whose worker was killed
    in step 19, at the default lease TTL."""
    from django_jobqueue.models import Job

    args = ["--poll-interval", "0.05"]
    pk = killed_in_step_19(True, args)
    started = time.perf_counter()
    second = harness.start_workers(1, args)
    try:
        harness.wait_until(lambda: Job.objects.get(pk=pk).state == "done", 120, 0.005)
        return time.perf_counter() - started
    finally:
        harness.stop_workers(second)


def step_cost(count: int = 500) -> dict[str, float]:
    """Median seconds of one no-op step, and of one enqueue()."""
    import django_jobqueue as jobqueue
    from django_jobqueue import conf
    from django_jobqueue.dialects import get_dialect
    from django_jobqueue.engine import leases
    from django_jobqueue.engine.context import JobContext

    harness.reset()
    dialect = get_dialect("default")
    enqueues = []
    for _ in range(count):
        started = time.perf_counter()
        jobqueue.enqueue("bench.noop")
        enqueues.append(time.perf_counter() - started)
    harness.reset()
    jobqueue.enqueue("bench.steps")
    [claimed] = leases.claim(dialect, owner="bench", queues=[], limit=1, lease_ttl=600)
    ctx = JobContext(claimed.model(), claimed.attempts, "bench", 600.0, dialect,
                     _max_result_bytes=conf.get().max_result_bytes)  # fmt: skip
    steps = []
    for n in range(count):
        started = time.perf_counter()
        ctx.step(f"noop-{n}", lambda: None)
        steps.append(time.perf_counter() - started)
    step_ms = statistics.median(steps) * 1000
    enqueue_ms = statistics.median(enqueues) * 1000
    return {"step_ms": step_ms, "enqueue_ms": enqueue_ms, "ratio": step_ms / enqueue_ms}


def drain(handler: str, jobs: int) -> float:
    """Steady jobs/s of `jobs` jobs of `handler` on 2 workers at --concurrency 8."""
    from django.db import transaction

    import django_jobqueue as jobqueue

    harness.reset()
    with transaction.atomic():
        jobqueue.enqueue_many([(handler, {})] * jobs)
    harness.analyze()
    workers = harness.start_workers(2, ["--concurrency", "8", "--poll-interval", "0.05"])
    try:
        harness.wait_until(lambda: harness.done_count() > 0, 120)
        first, started = harness.done_count(), time.perf_counter()
        harness.wait_until(lambda: harness.done_count() >= jobs, 600)
        return (jobs - first) / (time.perf_counter() - started)
    finally:
        harness.stop_workers(workers)


def fill_suspended(count: int) -> None:
    """`count` suspended jobs: half sleeping for a day, half waiting for events, each with a
    step record, written in bulk."""
    import datetime as dt

    from django.db import transaction
    from django.utils import timezone

    from django_jobqueue.models import Job, JobStep, JobWait

    later = timezone.now() + dt.timedelta(days=1)
    for start in range(0, count, 5000):
        size = min(5000, count - start)
        with transaction.atomic():
            rows = Job.objects.bulk_create(
                Job(
                    type="bench.sleep_once",
                    state=Job.State.SCHEDULED if n % 2 else Job.State.WAITING,
                    run_after=later if n % 2 else None,
                )
                for n in range(size)
            )
            if not rows[0].pk:  # MySQL returns no ids from a bulk insert
                rows = list(Job.objects.order_by("-pk")[:size])
            JobStep.objects.bulk_create(
                JobStep(job_id=job.pk, name="before", seq=1, result=1, attempt=1) for job in rows
            )
            JobWait.objects.bulk_create(
                JobWait(job_id=job.pk, key=f"event-{job.pk}", until=later)
                for job in rows
                if job.state == Job.State.WAITING
            )
    harness.analyze()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--suspended", type=int, default=100_000)
    opts = parser.parse_args()
    harness.setup()
    plain, stepped = restart(durable=False), restart(durable=True)
    harness.report("durable_restart", {"plain_s": plain, "steps_s": stepped,
                                       "ratio": stepped / plain})  # fmt: skip
    harness.report("durable_recovery", {"restart_to_done_s": recovery()})
    harness.report("durable_step_cost", step_cost())
    plain_rate = drain("bench.noop", opts.jobs)
    sleeping_rate = drain("bench.sleep_once", opts.jobs)
    harness.report(
        "durable_sleep_drain",
        {"jobs": opts.jobs, "plain_per_s": plain_rate, "sleeping_per_s": sleeping_rate,
         "ratio": sleeping_rate / plain_rate},
    )  # fmt: skip
    harness.reset()
    empty = claim_cost()
    harness.reset()
    fill_suspended(opts.suspended)
    full = claim_cost()
    harness.report(
        "durable_suspended_claim",
        {"suspended": opts.suspended, "empty_ms": empty["claim_ms_median"],
         "full_ms": full["claim_ms_median"],
         "ratio": full["claim_ms_median"] / empty["claim_ms_median"]},
    )  # fmt: skip
    harness.reset()


if __name__ == "__main__":
    main()
