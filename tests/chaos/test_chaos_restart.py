"""The database server restarted while workers drain jobs: they reconnect with backoff, and
nothing is lost (PostgreSQL and MariaDB/MySQL).

The server is stopped and started with shell commands: JOBQUEUE_CHAOS_PG_STOP and
JOBQUEUE_CHAOS_PG_START, JOBQUEUE_CHAOS_MYSQL_STOP and JOBQUEUE_CHAOS_MYSQL_START. Without them,
under CI=true only, the commands of the project's machines (../shared/SERVICES.md) restart
the server on 127.0.0.1 at the default port, where nothing else runs meanwhile. Elsewhere the
test is skipped without them (other sessions may share the server), and fails under CI=true;
JOBQUEUE_CHAOS_RESTART=skip skips it deliberately.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from django.db import InterfaceError, OperationalError, connection

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

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.chaos,
    pytest.mark.slow,
    pytest.mark.server_restart,
    pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite has no server to restart"),
]

CLUSTER = "$(ls /etc/postgresql | head -1) main"
DEFAULTS = {
    "postgresql": (
        "PG",
        5432,
        f"pg_ctlcluster --skip-systemctl-redirect {CLUSTER} stop -m fast",
        f"pg_ctlcluster --skip-systemctl-redirect {CLUSTER} start",
    ),
    "mysql": (
        "MYSQL",
        3306,
        "mariadb-admin -h 127.0.0.1 -P 3306 -uroot shutdown",
        # Wait for the old process to be gone: --oknodo would take it for a running server.
        "for _ in $(seq 300); do pgrep -x mariadbd >/dev/null || break; sleep 0.2; done; "
        "start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd",
    ),
}
# What a worker logs while its server is away: retried, never fatal. "Lost the lease" also
# shows when the server went away during the COMMIT of an outcome: the commit took, the
# acknowledgement was lost, and the retried write finds the job finished already (the audit
# proves the outcome is that attempt's).
OUTAGE = ("Database error in the worker loop", "Could not record", "Lost the lease")
HANDLER_OUTAGE = ("django.db.utils.OperationalError", "django.db.utils.InterfaceError")
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


def restart_commands() -> tuple[str, str]:
    """The (stop, start) shell commands for the server of the test database."""
    if os.environ.get("JOBQUEUE_CHAOS_RESTART") == "skip":
        pytest.skip("JOBQUEUE_CHAOS_RESTART=skip")
    name, port, stop, start = DEFAULTS[connection.vendor]
    given = (
        os.environ.get(f"JOBQUEUE_CHAOS_{name}_STOP"),
        os.environ.get(f"JOBQUEUE_CHAOS_{name}_START"),
    )
    if given[0] and given[1]:
        return given[0], given[1]
    settings = connection.settings_dict
    where = f"{settings['HOST']}:{settings['PORT'] or port}"
    ci = os.environ.get("CI") == "true"
    default = settings["HOST"] in ("127.0.0.1", "localhost") and where.endswith(f":{port}")
    if ci and default:
        return stop, start  # CI's own services, which nothing else uses meanwhile
    reason = (
        f"restarting the server at {where} needs JOBQUEUE_CHAOS_{name}_STOP and "
        f"JOBQUEUE_CHAOS_{name}_START (CI=true restarts the default services on loopback)"
    )
    if ci:
        pytest.fail(reason)
    pytest.skip(reason)


def wait_until_ready(timeout: float = 120.0) -> float:
    """Reconnect until the server answers; return the seconds it took."""
    started = time.monotonic()
    while True:
        connection.close()
        try:
            connection.ensure_connection()
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
            return time.monotonic() - started
        except (OperationalError, InterfaceError):
            if time.monotonic() - started > timeout:
                raise
            time.sleep(0.5)


def restart(stop: str, start: str, down_for: float) -> float:
    """Stop the server, keep it down `down_for` seconds, start it again (always); return how
    long it was unreachable."""
    stopped = time.monotonic()
    try:
        subprocess.run(stop, shell=True, check=True, timeout=120, capture_output=True)
        time.sleep(down_for)
    finally:
        subprocess.run(start, shell=True, check=True, timeout=120, capture_output=True)
        wait_until_ready()
    return time.monotonic() - stopped


def test_server_restarts_mid_run_lose_nothing(start_worker, chaos_report):
    stop, start = restart_commands()
    wait_until_ready()
    rnd, seed = seeded_random()
    work = build_workload(
        rnd, independent=env_int("JOBQUEUE_CHAOS_RESTART_JOBS", 1500), boxes=4, per_box=25
    )
    ids = work.ids
    started = time.monotonic()
    supervisor = Supervisor(start_worker, 3, WORKER_ARGS)
    restarts, outage = 0, 0.0
    try:
        for share in (0.8, 0.5):  # restart at 20% and at 50% done
            deadline = time.monotonic() + 180
            while unfinished(ids) > len(ids) * share:
                assert time.monotonic() < deadline, describe_unfinished(ids)
                supervisor.assert_healthy()
                time.sleep(0.2)
            # Longer than a lease TTL: the completer and the heartbeat must ride it out.
            outage += restart(stop, start, down_for=6.0)
            restarts += 1
        deadline = time.monotonic() + 180
        while retrying(lambda: unfinished(ids)):
            assert time.monotonic() < deadline, describe_unfinished(ids)
            supervisor.assert_healthy()
            time.sleep(0.25)
    finally:
        wait_until_ready()  # whatever happened, the server is up again for the next tests
    elapsed = time.monotonic() - started
    supervisor.assert_healthy()
    # A handler whose own write hit the outage failed its attempt, and was retried.
    result = audit(work, tolerated=HANDLER_OUTAGE)
    line = chaos_report(
        "server-restart",
        jobs=result.jobs,
        workers=len(supervisor.workers),
        restarts=restarts,
        down_seconds=round(outage),
        re_runs=result.reruns,
        reclaimed=result.reclaimed,
        lost=result.lost,
        seconds=round(elapsed),
        seed=seed,
    )
    assert not result.problems, "\n".join([line, *result.problems[:30]])
    assert result.lost == 0
    assert supervisor.stop_all() == [0] * len(supervisor.workers)
    reconnects = 0
    for worker in supervisor.workers:
        reconnects += sum(worker.output().count(marker) for marker in OUTAGE)
        check_log(worker, tolerated=OUTAGE)
    assert reconnects > 0  # the workers did see the outage
