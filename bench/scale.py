"""Jobs that are not instant, by worker processes: N jobs that each sleep S seconds (20 ms).

`BENCH_DB=pg python -m bench.scale [--jobs 4000] [--seconds 0.02] [--procs 1 2 4 8]
[--concurrency 8]`

For each number of processes, reports the steady rate (first job done to last) as a fraction
of the ideal (processes x concurrency / seconds), the workers' CPU per job and, on
PostgreSQL, the server's CPU per job (every `postgres` process on this machine, from /proc:
run it on a machine with nothing else on the server) and the most server connections the
workers held (backends of the bench database, sampled every 20 ms; BENCH_DB_POOL='{"max_size":
2}' gives the workers Django's connection pool). With `--pgqueuer PYTHON` (default: the peer
harness's venv, /tmp/peers-venv, when it exists) and BENCH_DB=pg, PGQueuer and
Procrastinate drain the same jobs (async sleeps, their native mode) with as many worker
processes at the same concurrency (`pgq run --max-concurrent-tasks`, `procrastinate worker
--concurrency`), in the same run, for ratios (bench/peer_sleep.py).
"""

from __future__ import annotations

import argparse
import time

from . import harness
from .async_io import PEERS_PYTHON, peer
from .connections import server_connections
from .peer_sleep import figures, server_cpu


def run(jobs: int, seconds: float, procs: int, concurrency: int) -> dict[str, object]:
    from django.db import transaction

    import django_jobqueue as jobqueue

    harness.reset()
    with transaction.atomic():
        jobqueue.enqueue_many([("bench.sleep", {"seconds": seconds})] * jobs)
    harness.analyze()
    workers = harness.start_workers(procs, ["--concurrency", str(concurrency)])
    peak = 0
    try:
        first = None
        while (done := harness.done_count()) < jobs:
            peak = max(peak, server_connections())
            if done and first is None:
                first = (time.perf_counter(), done, harness.cpu_seconds(w.pid for w in workers),
                         server_cpu())  # fmt: skip
            if any(w.poll() is not None for w in workers):
                raise RuntimeError("a worker exited early (see .bench-state/workers.log)")
            time.sleep(0.02)
        used = harness.cpu_seconds(w.pid for w in workers)
        last = (time.perf_counter(), jobs, used, server_cpu())
    finally:
        harness.stop_workers(workers)
    assert first is not None
    result = figures(first, last, procs, concurrency, seconds, cpu_key="worker_cpu_ms_per_job")
    return {**result, "peak_server_connections": peak}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--seconds", type=float, default=0.02)
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--pgqueuer", default=str(PEERS_PYTHON) if PEERS_PYTHON.exists() else "",
        help="a Python with the peers installed ('' skips them)",
    )  # fmt: skip
    args = parser.parse_args()
    harness.setup()
    for procs in args.procs:
        ours = run(args.jobs, args.seconds, procs, args.concurrency)
        harness.report("scale", ours)
        if harness.DB == "pg" and args.pgqueuer:
            for name in ("pgqueuer", "procrastinate"):
                theirs = peer(args.pgqueuer, name, args.jobs, args.seconds, args.concurrency, procs)
                harness.report("scale", theirs)
                ratio = {
                    "procs": procs,
                    f"rate_vs_{name}": round(
                        ours["steady_jobs_per_s"] / theirs["steady_jobs_per_s"], 2
                    ),
                    f"server_cpu_vs_{name}": round(
                        ours["server_cpu_ms_per_job"] / theirs["server_cpu_ms_per_job"], 2
                    ),
                }
                harness.report("scale_ratio", ratio)


if __name__ == "__main__":
    main()
