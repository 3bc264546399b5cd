"""A worker's server connections against its rate (issue 21), PostgreSQL, in one run.

`BENCH_DB=pg python -m bench.connections [--jobs 3000] [--concurrency 32] [--pool 4]`

One worker at `--concurrency 32` drains jobs that do one ORM read, one ORM write and a 50 ms
wait (`bench.orm_io`), connected three ways: straight to the server; with Django's connection
pool (`OPTIONS["pool"]`, `max_size` --pool); and through PgBouncer in transaction mode
(`default_pool_size` --pool, the listener's LISTEN on a direct alias). Each reports the steady
rate and the most server connections the worker held (backends of the bench database, sampled
every 20 ms, but the bench's own), and the rate as a ratio of the direct one.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from . import harness


def server_connections() -> int:
    """Backends connected to the bench database, this process's own left out (read on it: a
    server out of connections refuses a new one)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


def drain(jobs: int, concurrency: int, env: dict[str, str]) -> dict[str, float | int]:
    from django.db import transaction

    import django_jobqueue as jobqueue
    from django_jobqueue.models import JobEvent

    harness.reset()
    JobEvent.objects.all().delete()
    with transaction.atomic():
        jobqueue.enqueue_many([("bench.orm_io", {"seconds": 0.05})] * jobs)
    harness.analyze()
    os.environ.update(env)
    try:
        procs = harness.start_workers(1, ["--concurrency", str(concurrency), "--no-watchdog"])
    finally:
        for name in env:
            del os.environ[name]
    peak = 0
    try:
        first = None
        while (done := harness.done_count()) < jobs:
            if procs[0].poll() is not None:
                raise RuntimeError("the worker exited early (see .bench-state/workers.log)")
            if done and first is None:
                first = (time.perf_counter(), done)
            peak = max(peak, server_connections())
            time.sleep(0.02)
        last = time.perf_counter()
    finally:
        harness.stop_workers(procs)
    assert first is not None
    return {
        "jobs_per_s": round((jobs - first[1]) / (last - first[0]), 1),
        "peak_server_connections": peak,
    }


@contextmanager
def pgbouncer(pool_size: int) -> Iterator[int]:
    """PgBouncer in transaction mode on a free loopback port before the bench database (run
    as postgres: it refuses root); yield its port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    workdir = Path(tempfile.mkdtemp(prefix="bench-pgbouncer-"))
    (workdir / "users.txt").write_text('"postgres" ""\n')
    (workdir / "pgbouncer.ini").write_text(
        "[databases]\njobqueue_bench = host=127.0.0.1 port=5432 user=postgres\n[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\nauth_type = trust\n"
        f"auth_file = {workdir / 'users.txt'}\npool_mode = transaction\n"
        f"default_pool_size = {pool_size}\nmax_client_conn = 500\n"
        "ignore_startup_parameters = extra_float_digits\n"
    )
    owner = pwd.getpwnam("postgres")
    for path in (workdir, *workdir.iterdir()):
        os.chown(path, owner.pw_uid, owner.pw_gid)
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    proc = subprocess.Popen([binary, "-u", "postgres", str(workdir / "pgbouncer.ini")])
    try:
        harness.wait_until(lambda: _answers(port), timeout=30, interval=0.1)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


def _answers(port: int) -> bool:
    import psycopg

    try:
        psycopg.connect(f"host=127.0.0.1 port={port} user=postgres dbname=jobqueue_bench").close()
    except psycopg.OperationalError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--pool", type=int, default=4)
    args = parser.parse_args()
    if harness.DB != "pg":
        raise SystemExit("bench.connections runs on PostgreSQL (BENCH_DB=pg)")
    harness.setup()
    pool = json.dumps({"min_size": 1, "max_size": args.pool, "timeout": 60})
    runs = {
        "direct": {},
        "django_pool": {"BENCH_DB_POOL": pool},
        "django_pool_by_query": {"BENCH_DB_POOL": pool, "BENCH_POOL_RETURN": "query"},
    }
    with pgbouncer(args.pool) as port:
        runs["pgbouncer"] = {"BENCH_PGBOUNCER_PORT": str(port)}
        figures = {name: drain(args.jobs, args.concurrency, env) for name, env in runs.items()}
    direct = figures["direct"]["jobs_per_s"]
    for name, values in figures.items():
        ratio = round(values["jobs_per_s"] / direct, 2)
        harness.report(
            "connections",
            {"how": name, "concurrency": args.concurrency, "pool": args.pool, **values,
             "rate_vs_direct": ratio},
        )  # fmt: skip


if __name__ == "__main__":
    main()
