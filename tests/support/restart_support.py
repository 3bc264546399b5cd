"""Restarting the test database's server (tests marked `server_restart`, run alone in a lane).

The server is stopped and started with shell commands: JOBQUEUE_CHAOS_PG_STOP and
JOBQUEUE_CHAOS_PG_START, JOBQUEUE_CHAOS_MYSQL_STOP and JOBQUEUE_CHAOS_MYSQL_START. Without them,
under CI=true only, the commands of the project's machines (../shared/SERVICES.md) restart
the server on 127.0.0.1 at the default port, where nothing else runs meanwhile. Elsewhere a
test is skipped without them (other sessions may share the server), and fails under CI=true;
JOBQUEUE_CHAOS_RESTART=skip skips it deliberately.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time

import pytest
from django.db import InterfaceError, OperationalError, connection

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


@dataclasses.dataclass
class Restart:
    """When a restart stopped the server (time.time(): worker processes' clock too)."""

    began: float  # the stop command started: statements then running may fail
    down: float  # the server stopped answering: every connection was closed by then
    unreachable: float  # seconds it did not answer


def wait_until_down(timeout: float = 120.0) -> None:
    """Connect until the server refuses (a stop command may return before it is gone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        connection.close()
        try:
            connection.ensure_connection()
        except (OperationalError, InterfaceError):
            return
        time.sleep(0.05)
    raise AssertionError(f"the server still answers {timeout}s after its stop command")


def restart(stop: str, start: str, down_for: float) -> Restart:
    """Stop the server, keep it down `down_for` seconds, start it again (always)."""
    began, stopped = time.time(), time.monotonic()
    try:
        subprocess.run(stop, shell=True, check=True, timeout=120, capture_output=True)
        wait_until_down()
        down = time.time()
        time.sleep(down_for)
    finally:
        subprocess.run(start, shell=True, check=True, timeout=120, capture_output=True)
        wait_until_ready()
    return Restart(began, down, time.monotonic() - stopped)
