"""Shared helpers of the benchmarks: the database, worker processes, timing.

Run the benchmarks from the project root with the project's venv, e.g.
`BENCH_DB=pg .venv/bin/python -m bench.drain`; `bench/run.sh` (`make bench`) runs them all.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DB = os.environ.get("BENCH_DB", "sqlite")
NAME = os.environ.get("BENCH_DB_NAME", "jobqueue_bench")  # PostgreSQL's and MariaDB's


def setup() -> None:
    """Create the benchmark database if needed, set Django up and migrate."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.project.settings")
    sys.path.insert(0, str(ROOT))
    if DB == "pg":
        subprocess.run(
            ["createdb", "-h", "127.0.0.1", "-U", "postgres", NAME],
            capture_output=True,
        )
    elif DB == "mysql":
        subprocess.run(
            ["mariadb", "-uroot", "-h127.0.0.1", "-e",
             f"CREATE DATABASE IF NOT EXISTS {NAME} CHARACTER SET utf8mb4"],
            check=True,
        )  # fmt: skip
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def reset() -> None:
    """Empty the job tables."""
    from django.db import connection

    from django_jobqueue.models import (
        Job,
        JobDependency,
        JobEvent,
        JobMap,
        JobSequence,
        JobStep,
        JobWait,
        Limit,
        LimitSetting,
        ResourceStart,
        Worker,
    )

    models = (JobStep, JobWait, JobMap, JobEvent, JobDependency, Job, JobSequence, Worker)
    models += (Limit, LimitSetting, ResourceStart)
    tables = [m._meta.db_table for m in models]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("TRUNCATE " + ", ".join(tables) + " RESTART IDENTITY CASCADE")
        elif connection.vendor == "mysql":
            cursor.execute("SET FOREIGN_KEY_CHECKS = 0")
            for table in tables:
                cursor.execute(f"TRUNCATE TABLE {table}")
            cursor.execute("SET FOREIGN_KEY_CHECKS = 1")
        else:
            for table in tables:
                cursor.execute(f"DELETE FROM {table}")
    analyze()


def analyze() -> None:
    from django.db import connection

    from django_jobqueue.models import Job, Limit

    tables = ", ".join(m._meta.db_table for m in (Job, Limit))
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(f"ANALYZE TABLE {tables}")
            cursor.fetchall()
        elif connection.vendor == "postgresql":
            cursor.execute(f"VACUUM ANALYZE {tables}")
        else:
            cursor.execute("ANALYZE")


def start_workers(count: int, args: list[str]) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.project.settings"}
    log = open(ROOT / ".bench-state" / "workers.log", "ab")  # noqa: SIM115 - closed with the run
    return [
        subprocess.Popen(
            [sys.executable, "-m", "django", "jobqueue_worker", *args],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for _ in range(count)
    ]


def peak_rss_mb(proc: subprocess.Popen[bytes]) -> float | None:
    """The process's peak resident set size (VmHWM), in MB."""
    try:
        for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def cpu_seconds(procs: list[subprocess.Popen[bytes]]) -> float:
    """The CPU time (user + system, all threads) the processes have used so far."""
    total = 0
    for proc in procs:
        try:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / os.sysconf("SC_CLK_TCK")


def stop_workers(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.02) -> float:
    """Poll until `predicate()`; return the time it took (raise after `timeout`)."""
    started = time.perf_counter()
    while not predicate():
        if time.perf_counter() - started > timeout:
            raise TimeoutError(f"not reached within {timeout}s")
        time.sleep(interval)
    return time.perf_counter() - started


def done_count() -> int:
    from django_jobqueue.models import Job

    return Job.objects.filter(state="done").count()


def report(name: str, figures: dict[str, Any]) -> None:
    """Print one line of JSON per figure set, and append it to .bench-state/results.jsonl."""
    line = json.dumps({"bench": name, "db": DB, **figures})
    print(line, flush=True)
    with open(ROOT / ".bench-state" / "results.jsonl", "a") as out:
        out.write(line + "\n")
