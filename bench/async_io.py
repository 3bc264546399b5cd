"""Async I/O jobs at many slots: N jobs that each `await asyncio.sleep(S)`, one worker process.

`BENCH_DB=pg python -m bench.async_io [--jobs 3072] [--seconds 1] [--concurrency 512]`

Reports the steady rate (from the first job done to the last) as a fraction of the ideal
(concurrency / seconds), and the worker's CPU per job over the same span (user + system time
of the worker process, from /proc). With `--pgqueuer PYTHON` (default: the peer harness's venv,
/tmp/peers-venv, when it exists) and BENCH_DB=pg, PGQueuer and Procrastinate run the same
workload in the same run (bench/peer_sleep.py, under that interpreter), for ratios.

With `--steps` (`--jobs 10000 --concurrency 64`): jobs of an async handler that each take 3
durable steps of `await asyncio.sleep(0.05)`, their steady rate as a fraction of the ideal
(concurrency / 0.15 s); then the CPU of one durable step in an async handler against one in a
sync handler, in the worker (`steps`) and alone (`step_cpu`), in one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from . import harness

PEERS_PYTHON = Path("/tmp/peers-venv/bin/python")


def ours(
    jobs: int,
    seconds: float,
    concurrency: int,
    handler: str = "bench.async_sleep",
    args: dict[str, float] | None = None,
) -> dict[str, float | int | str | None]:
    """Our figures for `jobs` jobs of `handler` that each take `seconds` (with `args`, else
    {"seconds": seconds})."""
    from django.db import transaction

    import django_jobqueue as jobqueue

    harness.reset()
    with transaction.atomic():
        jobqueue.enqueue_many([(handler, args or {"seconds": seconds})] * jobs)
    harness.analyze()
    procs = harness.start_workers(1, ["--concurrency", str(concurrency), "--no-watchdog"])
    try:
        first = last = None
        while (done := harness.done_count()) < jobs:
            now = time.perf_counter()
            if done and first is None:
                first = (now, done, harness.cpu_seconds([procs[0].pid]))
            if procs[0].poll() is not None:
                raise RuntimeError("the worker exited early (see .bench-state/workers.log)")
            time.sleep(0.02)
        last = (time.perf_counter(), jobs, harness.cpu_seconds([procs[0].pid]))
    finally:
        harness.stop_workers(procs)
    assert first is not None
    figures = summary("django_jobqueue", first, last, seconds, concurrency)
    if handler != "bench.async_sleep":
        figures["handler"] = handler
    return figures


def summary(name, first, last, seconds, concurrency):
    span, count, cpu = last[0] - first[0], last[1] - first[1], last[2] - first[2]
    rate = count / span
    return {
        "queue": name,
        "concurrency": concurrency,
        "job_seconds": seconds,
        "steady_jobs_per_s": round(rate, 1),
        "of_ideal": round(rate / (concurrency / seconds), 3),
        "cpu_ms_per_job": round(1000 * cpu / count, 3),
    }


def peer(
    python: str, name: str, jobs: int, seconds: float, concurrency: int, procs: int = 1
) -> dict[str, object]:
    """A peer's figures for the same workload (bench/peer_sleep.py NAME under `python`)."""
    out = subprocess.run(
        [python, str(Path(__file__).with_name("peer_sleep.py")), name,
         str(jobs), str(seconds), str(concurrency), str(procs)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def orm(jobs: int, seconds: float, concurrency: int) -> None:
    """The ORM-bound job by an async and by a sync handler, and their ratio, in one run."""
    from django_jobqueue.models import JobEvent

    rates = {}
    for handler in ("bench.async_orm_io", "bench.orm_io"):
        JobEvent.objects.all().delete()
        figures = ours(jobs, seconds, concurrency, handler)
        harness.report("async_orm", figures)
        rates[handler] = figures["steady_jobs_per_s"]
    ratio = rates["bench.async_orm_io"] / rates["bench.orm_io"]
    harness.report("async_orm_ratio", {"async_vs_sync": round(ratio, 2)})


def step_cpu(count: int = 500, rounds: int = 6) -> dict[str, float]:
    """CPU ms of one durable step (a no-op, recorded) in an async handler against a sync one.

    The process's CPU time (every thread's) over `count` steps of a claimed job, in `rounds`
    alternating rounds (the medians are kept): sync steps in this thread; async steps with an
    async function and with a plain one, awaited on an event loop whose sync calls go to one
    sync-call thread, as in a worker (`SyncCallThreads`).
    """
    import asyncio

    import django_jobqueue as jobqueue
    from django_jobqueue import conf
    from django_jobqueue.dialects import get_dialect
    from django_jobqueue.engine import leases
    from django_jobqueue.engine.context import AsyncJobContext, JobContext
    from django_jobqueue.worker.sync_calls import SyncCallThreads

    harness.reset()
    dialect = get_dialect("default")
    for _ in range(3):
        jobqueue.enqueue("bench.steps")
    claimed = leases.claim(dialect, owner="bench", queues=[], limit=3, lease_ttl=3600)
    limit = conf.get().max_result_bytes
    sync, afn, plain = (
        (AsyncJobContext if n else JobContext)(
            job.model(), job.attempts, "bench", 3600.0, dialect, _max_result_bytes=limit
        )
        for n, job in enumerate(claimed)
    )
    threads = SyncCallThreads(1)

    async def anoop() -> None:
        return None

    async def async_steps(ctx: AsyncJobContext, fn: object, n: int) -> None:
        for _ in range(n):
            await ctx.step("noop", fn)

    def sync_steps(n: int) -> None:
        for _ in range(n):
            sync.step("noop", lambda: None)

    def cpu_ms(run: object) -> float:
        started = time.process_time()
        run()  # type: ignore[operator]
        return 1000 * (time.process_time() - started) / count

    sync_steps(20)  # connections opened, code warmed up
    for ctx, fn in ((afn, anoop), (plain, lambda: None)):
        asyncio.run(threads.run(async_steps(ctx, fn, 20)))
    figures: dict[str, list[float]] = {"sync": [], "async": [], "async_plain_fn": []}
    for _ in range(rounds):
        figures["sync"].append(cpu_ms(lambda: sync_steps(count)))
        figures["async"].append(
            cpu_ms(lambda: asyncio.run(threads.run(async_steps(afn, anoop, count))))
        )
        figures["async_plain_fn"].append(
            cpu_ms(lambda: asyncio.run(threads.run(async_steps(plain, lambda: None, count))))
        )
    threads.shutdown()
    medians = {k: statistics.median(v) for k, v in figures.items()}
    return {
        "sync_step_cpu_ms": round(medians["sync"], 3),
        "async_step_cpu_ms": round(medians["async"], 3),
        "async_plain_fn_step_cpu_ms": round(medians["async_plain_fn"], 3),
        "async_vs_sync": round(medians["async"] / medians["sync"], 2),
        "async_plain_fn_vs_sync": round(medians["async_plain_fn"] / medians["sync"], 2),
    }


def steps(jobs: int, concurrency: int) -> None:
    """Async jobs of 3 durable steps of a 0.05 s asyncio sleep; then a step's CPU, async / sync.

    In the worker: the CPU per job of jobs with the 3 steps less that of jobs that wait as
    long without any (an asyncio sleep; a time.sleep in a sync handler), over 3; the sync
    steps' jobs are a third as many (each holds a thread). Alone: `step_cpu`.
    """
    three = {"count": 3, "seconds": 0.05}
    figures = ours(jobs, 0.15, concurrency, "bench.async_steps", three)
    harness.report("async_steps", figures)
    cpu = {"async_steps": float(figures["cpu_ms_per_job"] or 0)}
    for handler, args in (
        ("bench.async_sleep", None),
        ("bench.sleep", None),
        ("bench.sync_steps", three),
    ):
        drained = ours(jobs // 3, 0.15, concurrency, handler, args)
        cpu[handler.split(".")[1]] = float(drained["cpu_ms_per_job"] or 0)
    async_step = (cpu["async_steps"] - cpu["async_sleep"]) / 3
    sync_step = (cpu["sync_steps"] - cpu["sleep"]) / 3
    harness.report(
        "async_step_cpu",
        {
            "in_worker_async_step_cpu_ms": round(async_step, 3),
            "in_worker_sync_step_cpu_ms": round(sync_step, 3),
            "in_worker_async_vs_sync": round(async_step / sync_step, 2),
            **step_cpu(),
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=3072)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, default=512)
    parser.add_argument(
        "--pgqueuer", default=str(PEERS_PYTHON) if PEERS_PYTHON.exists() else "",
        help="a Python with the peers installed ('' skips them)",
    )  # fmt: skip
    parser.add_argument(
        "--orm", action="store_true",
        help="jobs that do one ORM read, one write and the wait: async against sync handlers",
    )  # fmt: skip
    parser.add_argument(
        "--steps", action="store_true",
        help="async jobs of 3 durable steps of a 0.05 s sleep; a step's CPU, async / sync",
    )  # fmt: skip
    args = parser.parse_args()
    harness.setup()
    if args.steps:
        steps(args.jobs, args.concurrency)
        return
    if args.orm:
        orm(args.jobs, args.seconds, args.concurrency)
        return
    figures = ours(args.jobs, args.seconds, args.concurrency)
    harness.report("async_io", figures)
    if harness.DB == "pg" and args.pgqueuer:
        for name in ("pgqueuer", "procrastinate"):
            theirs = peer(args.pgqueuer, name, args.jobs, args.seconds, args.concurrency)
            harness.report("async_io", theirs)
            ratio = {
                f"rate_vs_{name}": figures["steady_jobs_per_s"] / theirs["steady_jobs_per_s"],
                f"cpu_per_job_vs_{name}": figures["cpu_ms_per_job"] / theirs["cpu_ms_per_job"],
            }
            harness.report("async_io_ratio", {k: round(v, 2) for k, v in ratio.items()})


if __name__ == "__main__":
    sys.exit(main())
