"""The database server restarted while workers drain jobs: they reconnect with backoff, nothing
is lost, and no attempt is charged to a connection the restart closed (PostgreSQL and
MariaDB/MySQL).

Before each restart a few jobs take threads and wait through it without touching the database
(as long jobs do): afterwards, their threads' next jobs must find their connections checked,
and those of them that then query must be handed back uncharged. The server is restarted with
the commands of `tests/support/restart_support.py`. JOBQUEUE_CHAOS_RESTARTS sets the number of
restarts (2: at 20% and 50% done, spread over 20% to 80% when more), and
JOBQUEUE_CHAOS_RESTART_EVERY ("60-90") restarts every 60 to 90 seconds instead, for a longer
soak (size it with JOBQUEUE_CHAOS_RESTART_JOBS).
"""

from __future__ import annotations

import os
import time

import pytest

import django_jobqueue as jobqueue
from django_jobqueue.models import Job
from tests.chaos.support import (
    Supervisor,
    audit,
    build_workload,
    check_log,
    describe_unfinished,
    env_int,
    retrying,
    seeded_random,
    unfinished,
)
from tests.conftest import HANDED_BACK
from tests.support.markers import not_sqlite
from tests.support.restart_support import restart, restart_commands, wait_until_ready

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.chaos,
    pytest.mark.slow,
    pytest.mark.server_restart,
    not_sqlite("SQLite has no server to restart"),
]

# What a worker logs while its server is away: retried, never fatal. "Lost the lease" also
# shows when the server went away during the COMMIT of an outcome: the commit took, the
# acknowledgement was lost, and the retried write finds the job finished already (the audit
# proves the outcome is that attempt's).
OUTAGE = ("Database error in the worker loop", "Could not record", "Lost the lease")
# A connection error charged to an attempt. The workload's handler raises the errors of its
# later statements as LostMidJob (it had touched the database): only its first statement
# fails with these. While the server goes down the statement may be running (the server may
# even commit it), and that attempt counts; sent on a connection the restart had closed, it
# must never be charged. The handler notes when it failed (JOBQUEUE_CHAOS_FAILURES).
HANDLER_OUTAGE = ("django.db.utils.OperationalError", "django.db.utils.InterfaceError")
IN_FLIGHT_MARGIN = 0.5  # seconds after the server stopped answering, for the news to arrive
MID_JOB = ("tests.testapp.chaos_jobs.LostMidJob",)
DOWN_FOR = 6.0  # seconds; longer than a lease TTL: the completer and heartbeat ride it out
IDLERS = 4  # jobs that hold a thread through each restart
WORKER_ARGS = (
    "--concurrency",
    "4",
    "--lease-ttl",
    "5",
    "--heartbeat-interval",
    "1",
    "--shutdown-timeout",
    "10",
)


def test_server_restarts_mid_run_lose_nothing(start_worker, chaos_report, tmp_path):
    stop, start = restart_commands()
    wait_until_ready()
    rnd, seed = seeded_random()
    work = build_workload(
        rnd, independent=env_int("JOBQUEUE_CHAOS_RESTART_JOBS", 1500), boxes=4, per_box=25
    )
    ids = work.ids
    started = time.monotonic()
    failures = tmp_path / "first-statement-failures.txt"
    supervisor = Supervisor(
        start_worker, 3, WORKER_ARGS, env={"JOBQUEUE_CHAOS_FAILURES": str(failures)}
    )
    restarts, outage, idlers = env_int("JOBQUEUE_CHAOS_RESTARTS", 2), 0.0, []
    stops: list[tuple[float, float]] = []  # when each stop began, and when it was down
    every = os.environ.get("JOBQUEUE_CHAOS_RESTART_EVERY")
    try:
        for number in range(restarts):
            if every:
                low, high = (float(bound) for bound in every.split("-"))
                until = time.monotonic() + rnd.uniform(low, high)
                while time.monotonic() < until:
                    supervisor.assert_healthy()
                    time.sleep(0.5)
            else:
                share = 0.8 - 0.6 * number / max(restarts, 2)  # 2: at 20% and at 50% done
                deadline = time.monotonic() + 180
                while unfinished(ids) > len(ids) * share:
                    assert time.monotonic() < deadline, describe_unfinished(ids)
                    supervisor.assert_healthy()
                    time.sleep(0.2)
            marker = tmp_path / f"restarted-{number}"
            idlers += hold_threads(marker)
            done = restart(stop, start, down_for=DOWN_FOR)
            stops.append((done.began, done.down + IN_FLIGHT_MARGIN))
            outage += done.unreachable
            marker.touch()
        deadline = time.monotonic() + 180
        while retrying(lambda: unfinished(ids + idlers)):
            assert time.monotonic() < deadline, describe_unfinished(ids + idlers)
            supervisor.assert_healthy()
            time.sleep(0.25)
    finally:
        wait_until_ready()  # whatever happened, the server is up again for the next tests
    elapsed = time.monotonic() - started
    supervisor.assert_healthy()
    # A handler whose statement was running as the server went down failed its attempt.
    result = audit(work, tolerated=MID_JOB + HANDLER_OUTAGE)
    failed_at = {
        (int(job), int(attempt)): float(at)
        for job, attempt, at in (line.split() for line in failures.read_text().splitlines())
    } if failures.exists() else {}  # fmt: skip
    in_flight, charged = 0, []
    for pk, errors in Job.objects.filter(pk__in=ids + idlers).values_list("pk", "errors"):
        for error in errors or []:
            if error["type"] not in HANDLER_OUTAGE:
                continue
            at = failed_at.get((pk, error["attempt"]))
            if at is not None and any(began <= at <= down for began, down in stops):
                in_flight += 1
            else:
                charged.append((pk, error["attempt"], at, error["message"][:200]))
    held = Job.objects.filter(pk__in=idlers).values_list("state", "attempts", "errors")
    spared = sum(worker.output().count(HANDED_BACK) for worker in supervisor.workers)
    line = chaos_report(
        "server-restart",
        jobs=result.jobs,
        workers=len(supervisor.workers),
        restarts=restarts,
        down_seconds=round(outage),
        re_runs=result.reruns,
        reclaimed=result.reclaimed,
        handed_back=spared,
        in_flight=in_flight,
        lost=result.lost,
        seconds=round(elapsed),
        seed=seed,
    )
    assert not charged, f"{line}\ncharged to a closed connection: {charged[:30]}, {stops}"
    assert all(row == (Job.State.DONE, 1, []) for row in held), (line, list(held))
    assert not result.problems, "\n".join([line, *result.problems[:30]])
    assert result.lost == 0
    assert supervisor.stop_all() == [0] * len(supervisor.workers)
    reconnects = 0
    for worker in supervisor.workers:
        reconnects += sum(worker.output().count(marker) for marker in OUTAGE)
        check_log(worker, tolerated=OUTAGE)
    assert reconnects > 0  # the workers did see the outage
    assert spared > 0  # the idlers that query met their closed connections


def hold_threads(marker) -> list[int]:
    """Enqueue IDLERS jobs that wait for `marker` without touching the database (every other
    one queries then), first in line; return their ids once their handlers run."""
    jobs = [
        jobqueue.enqueue(
            "conn.after_file", {"path": str(marker), "query": k % 2 == 0}, priority=100
        )
        for k in range(IDLERS)
    ]
    ids = [int(job.pk) for job in jobs]
    deadline = time.monotonic() + 60
    while Job.objects.filter(pk__in=ids, state=Job.State.RUNNING).count() < len(ids):
        assert time.monotonic() < deadline, describe_unfinished(ids)
        time.sleep(0.05)
    time.sleep(0.5)  # claimed together with short jobs queued before them: those end in ms
    return ids
