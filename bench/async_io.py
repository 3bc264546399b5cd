"""Async I/O jobs at many slots: N jobs that each `await asyncio.sleep(S)`, one worker process.

`BENCH_DB=pg python -m bench.async_io [--jobs 3072] [--seconds 1] [--concurrency 512]`

Reports the steady rate (from the first job done to the last) as a fraction of the ideal
(concurrency / seconds), and the worker's CPU per job over the same span (user + system time
of the worker process, from /proc). With `--pgqueuer PYTHON` (default: the peer harness's venv,
/tmp/peers-venv, when it exists) and BENCH_DB=pg, PGQueuer and Procrastinate run the same
workload in the same run (bench/peer_sleep.py, under that interpreter), for ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from . import harness

TICK = os.sysconf("SC_CLK_TCK")
PEERS_PYTHON = Path("/tmp/peers-venv/bin/python")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def ours(
    jobs: int, seconds: float, concurrency: int, handler: str = "bench.async_sleep"
) -> dict[str, float | int | str | None]:
    from django.db import transaction

    import django_jobqueue as jobqueue

    harness.reset()
    with transaction.atomic():
        jobqueue.enqueue_many([(handler, {"seconds": seconds})] * jobs)
    harness.analyze()
    procs = harness.start_workers(1, ["--concurrency", str(concurrency), "--no-watchdog"])
    try:
        first = last = None
        while (done := harness.done_count()) < jobs:
            now = time.perf_counter()
            if done and first is None:
                first = (now, done, cpu_seconds(procs[0].pid))
            if procs[0].poll() is not None:
                raise RuntimeError("the worker exited early (see .bench-state/workers.log)")
            time.sleep(0.02)
        last = (time.perf_counter(), jobs, cpu_seconds(procs[0].pid))
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
    args = parser.parse_args()
    harness.setup()
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
