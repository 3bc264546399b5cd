"""A peer running bench/async_io.py's and bench/scale.py's workload: N jobs that each
`await asyncio.sleep(S)`.

Run by those benches under a Python that has the peers installed (the peer harness's venv):
`peer_sleep.py pgqueuer|procrastinate JOBS SECONDS CONCURRENCY [PROCESSES]` prints one JSON
line. Each of the PROCESSES workers (default 1) is, for PGQueuer, `pgq run` with
`--max-concurrent-tasks CONCURRENCY` and `--batch-size` (PGQUEUER_BATCH_SIZE, default 100,
or half the concurrency if less); for Procrastinate, `procrastinate worker` with
`--concurrency CONCURRENCY` (its async tasks then run side by side on its event loop),
keeping its finished jobs (the count reads them). Each peer has a database of its own
(jobqueue_bench_pgqueuer, jobqueue_bench_procrastinate, created here). The CPU figures are
the workers' and, as bench/scale.py counts it, every `postgres` process's.
Standalone: it imports nothing of the project, since it runs in the peers' venv.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

DB = "jobqueue_bench_pgqueuer"
DSN = f"postgresql://postgres@127.0.0.1:5432/{DB}"
PROCRASTINATE_DB = "jobqueue_bench_procrastinate"
PROCRASTINATE_DSN = f"postgresql://postgres@127.0.0.1:5432/{PROCRASTINATE_DB}"
TICK = os.sysconf("SC_CLK_TCK")

try:  # the app `procrastinate worker --app=peer_sleep.app` runs
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=PROCRASTINATE_DSN))

    @app.task(name="sleep")
    async def sleep_task(seconds: float) -> None:
        await asyncio.sleep(seconds)

except ImportError:  # only the PGQueuer side is used
    pass


@asynccontextmanager
async def create_pgqueuer() -> AsyncIterator[object]:
    """The factory `pgq run` calls in the worker process."""
    import asyncpg
    from pgqueuer import PgQueuer
    from pgqueuer.db import AsyncpgDriver

    connection = await asyncpg.connect(DSN)
    pgq = PgQueuer(AsyncpgDriver(connection))

    @pgq.entrypoint("sleep")
    async def sleep(job: object) -> None:
        await asyncio.sleep(float(job.payload))  # type: ignore[attr-defined]

    try:
        yield pgq
    finally:
        await connection.close()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def server_cpu() -> float:
    """CPU seconds used so far by every process named `postgres` (or `mariadbd`)."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        if text[text.index("(") + 1 : text.rindex(")")] in ("postgres", "mariadbd"):
            fields = text.rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / TICK
    return total


def figures(
    first: tuple[float, int, float, float],
    last: tuple[float, int, float, float],
    processes: int,
    concurrency: int,
    seconds: float,
    cpu_key: str = "cpu_ms_per_job",
) -> dict[str, float | int | None]:
    """The steady figures between two samples of (time, jobs done, workers' CPU, server CPU)."""
    count = last[1] - first[1]
    rate = count / (last[0] - first[0])
    return {
        "procs": processes,
        "concurrency": concurrency,
        "job_seconds": seconds,
        "steady_jobs_per_s": round(rate, 1),
        # No-op jobs (0 s) have no ideal rate.
        "of_ideal": round(rate * seconds / (processes * concurrency), 3) if seconds else None,
        cpu_key: round(1000 * (last[2] - first[2]) / count, 3),
        "server_cpu_ms_per_job": round(1000 * (last[3] - first[3]) / count, 3),
    }


def start(command: list[str], processes: int) -> list[subprocess.Popen[bytes]]:
    """`processes` worker processes running `command` from this folder, in sessions of their
    own (stopped by group)."""
    here = Path(__file__).resolve().parent
    return [
        subprocess.Popen(
            command, cwd=here, env={**os.environ, "PYTHONPATH": str(here)},
            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        for _ in range(processes)
    ]  # fmt: skip


def pgqueuer(jobs: int, seconds: float, concurrency: int, processes: int) -> tuple:
    """Enqueue for PGQueuer and start its workers; return (label, workers, done count query,
    monitor connection)."""
    import asyncpg
    import psycopg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    subprocess.run(["createdb", "-h", "127.0.0.1", "-U", "postgres", DB], capture_output=True)
    mon = psycopg.connect(DSN, autocommit=True)
    if not mon.execute("SELECT to_regclass('pgqueuer') IS NOT NULL").fetchone()[0]:
        subprocess.run([sys.executable, "-m", "pgqueuer", "--pg-dsn", DSN, "install"],
                       check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    mon.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics RESTART IDENTITY")

    async def enqueue() -> None:
        conn = await asyncpg.connect(DSN)
        payload = str(seconds).encode()
        await Queries(AsyncpgDriver(conn)).enqueue(["sleep"] * jobs, [payload] * jobs, [0] * jobs)
        await conn.close()

    asyncio.run(enqueue())
    mon.execute("VACUUM ANALYZE pgqueuer")
    # PGQueuer wants at least twice the batch in concurrent tasks.
    batch = os.environ.get("PGQUEUER_BATCH_SIZE", str(min(100, concurrency // 2)))
    workers = start(
        [sys.executable, "-m", "pgqueuer", "run", f"{Path(__file__).stem}:create_pgqueuer",
         "--max-concurrent-tasks", str(concurrency), "--batch-size", batch],
        processes,
    )  # fmt: skip
    done = "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"
    return f"pgqueuer (batch {batch})", workers, done, mon


def procrastinate_(jobs: int, seconds: float, concurrency: int, processes: int) -> tuple:
    """Enqueue for Procrastinate and start its workers; as `pgqueuer()`."""
    import psycopg

    subprocess.run(
        ["createdb", "-h", "127.0.0.1", "-U", "postgres", PROCRASTINATE_DB], capture_output=True
    )
    mon = psycopg.connect(PROCRASTINATE_DSN, autocommit=True)
    with app.open():
        if not mon.execute("SELECT to_regclass('procrastinate_jobs') IS NOT NULL").fetchone()[0]:
            app.schema_manager.apply_schema()
        mon.execute(
            "TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_periodic_defers, "
            "procrastinate_workers RESTART IDENTITY CASCADE"
        )
        sleep_task.batch_defer(*([{"seconds": seconds}] * jobs))
    mon.execute("VACUUM ANALYZE procrastinate_jobs")
    workers = start(
        [sys.executable, "-m", "procrastinate", f"--app={Path(__file__).stem}.app", "worker",
         f"--concurrency={concurrency}"],
        processes,
    )  # fmt: skip
    done = "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
    return f"procrastinate (concurrency {concurrency})", workers, done, mon


def main(peer: str, jobs: int, seconds: float, concurrency: int, processes: int = 1) -> None:
    begin = {"pgqueuer": pgqueuer, "procrastinate": procrastinate_}[peer]
    label, workers, done_sql, mon = begin(jobs, seconds, concurrency, processes)

    def cpu() -> float:
        return sum(cpu_seconds(worker.pid) for worker in workers)

    def done() -> int:
        return mon.execute(done_sql).fetchone()[0]

    try:
        first = None
        started = time.perf_counter()
        while (count := done()) < jobs:
            now = time.perf_counter()
            if count and first is None:
                first = (now, count, cpu(), server_cpu())
            if any(w.poll() is not None for w in workers) or now - started > 600:
                raise RuntimeError(f"{peer} stopped or stalled at {count}/{jobs}")
            time.sleep(0.02)
        last = (time.perf_counter(), jobs, cpu(), server_cpu())
    finally:
        for worker in workers:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGTERM)
        for worker in workers:
            worker.wait(30)
    assert first is not None
    print(json.dumps({"queue": label, **figures(first, last, processes, concurrency, seconds)}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]),
         int((sys.argv[5:] or [1])[0]))  # fmt: skip
