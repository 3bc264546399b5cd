"""Shared fixtures: the database under test, and worker subprocesses that use it."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hypothesis
import pytest
from django.conf import settings as django_settings
from django.db import DatabaseError, connection, connections

from tests.support.forkserver import SETTINGS_ENV

# Hypothesis's health check of how fast inputs are generated measures the machine, not the
# code: on a loaded CI machine it failed a test that had generated 3 inputs in 1.1 s. No
# deadline either, for the same reason.
hypothesis.settings.register_profile(
    "jobqueue", suppress_health_check=[hypothesis.HealthCheck.too_slow], deadline=None
)
hypothesis.settings.load_profile("jobqueue")

ROOT = Path(__file__).resolve().parent.parent

# The job_queue fixture, enabled as a project would (tests/project/test_testing_helpers.py uses it).
pytest_plugins = ["django_jobqueue.testing.pytest_plugin"]


def pytest_configure(config: pytest.Config) -> None:
    from tests.support import fast_flush

    fast_flush.install()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that starts worker processes `processes` (the CI matrix leaves them to
    the main lanes: they prove the worker's behaviour, which the Python and Django versions do
    not change, and they take most of a lane's time)."""
    for item in items:
        if "start_worker" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.processes)
    longest_files_first(items)


# Seconds a test of each kind takes, about (the means of a PostgreSQL lane on 2026-12-05: a
# browser test 20, `slow` 6.3, other `processes` 2.1, the rest 0.2). Only their order matters.
EXPECTED_SECONDS = (("browser", 20.0), ("slow", 6.0), ("processes", 2.0))


def expected_seconds(item: pytest.Item) -> float:
    for marker, seconds in EXPECTED_SECONDS:
        if item.get_closest_marker(marker) is not None:
            return seconds
    return 0.2


def longest_files_first(items: list[pytest.Item]) -> None:
    """Order the test files by the time they are expected to take, longest first (the tests
    of a file keep their order). A lane hands whole files to its xdist processes in this order
    (`--dist loadfile --no-loadscope-reorder`): a long file handed out last would run on alone
    while the other processes sit idle (a few tests of tens of seconds each, such as the
    browser tours, were handed out last when files went by their number of tests)."""
    files: dict[str, float] = {}
    for item in items:
        path = item.nodeid.split("::")[0]
        files[path] = files.get(path, 0.0) + expected_seconds(item)
    items.sort(key=lambda item: -files[item.nodeid.split("::")[0]])


def poll(predicate: Callable[[], Any], timeout: float = 60.0, interval: float = 0.05) -> Any:
    """Return predicate()'s first truthy value, failing the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


def wait_for_job(pk: int, *states: str, timeout: float = 60.0) -> Any:
    """Return job `pk` once it is in one of `states`; fail showing its row if it never does."""
    from django_jobqueue.models import Job

    def reached() -> Any:
        job = Job.objects.get(pk=pk)
        return job if job.state in states else None

    try:
        return poll(reached, timeout)
    except AssertionError:
        job = Job.objects.get(pk=pk)
        raise AssertionError(
            f"job {pk} is {job.state} (attempts={job.attempts}, owner={job.lease_owner}, "
            f"last_error={job.last_error}), not {states}, after {timeout}s"
        ) from None


# Lines a healthy worker never logs, whatever the database.
TROUBLE = (
    "database is locked",
    "Database error in the worker loop",
    "Could not record",
    "Lost the lease",
    "Traceback",
)


# A heartbeat waits at most half its interval for a lock (so that the next beat is never late)
# and tries again soon after: on a busy SQLite file, a skipped beat logs this, and only this,
# line: "gave up after 1 attempts on lock contention" for the worker's row, "after 2 attempts"
# for a chunk of its lease rows (renew_leases tries twice). It loses nothing (a lease outlives
# several beats); a loaded machine makes it common. Only lock contention says "gave up after".
SKIPPED_BEAT = "Worker duty heartbeat failed (gave up after "

# What a worker logs when jobs met a connection the server had closed before they touched the
# database, and were handed back uncharged (issue 46).
HANDED_BACK = "met a database connection the server had closed"


def assert_clean_log(text: str, *, allow: tuple[str, ...] = ()) -> None:
    """Fail if a worker log shows database trouble, a lost lease or an uncaught exception."""
    text = "\n".join(line for line in text.splitlines() if not line.startswith(SKIPPED_BEAT))
    for marker in TROUBLE:
        if marker not in allow:
            assert marker not in text, f"worker log contains {marker!r}:\n{text[-4000:]}"


class ForkedProcess:
    """A worker forked by the fork server (`tests/support/forkserver.py`), driven as a Popen is."""

    def __init__(self, channel: socket.socket, args: list[str]) -> None:
        self._channel = channel
        self._reader = channel.makefile("r")
        self.args = args
        self.returncode: int | None = None
        kind, value = self._reader.readline().split()
        assert kind == "pid", kind
        self.pid = int(value)

    def _read_exit(self, timeout: float | None) -> None:
        if self.returncode is not None:
            return
        if select.select([self._channel], [], [], timeout)[0]:
            line = self._reader.readline()
            kind, value = line.split() if line else ("exit", "-9")  # the fork server died
            assert kind == "exit", kind
            self.returncode = int(value)
            self._reader.close()
            self._channel.close()

    def poll(self) -> int | None:
        self._read_exit(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._read_exit(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)


class ForkServer:
    """The session's fork server: started at the first worker, stopped at the session's end."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = str(directory / "forkserver.sock")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(
        self, args: list[str], log: Path, env: dict[str, str], err: Path | None = None
    ) -> ForkedProcess:
        if self.proc is None or self.proc.poll() is not None:
            self._launch()
        channel = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            channel.connect(self.path)
            request = {"args": args, "log": str(log), "cwd": str(ROOT), "env": env,
                       "err": str(err) if err else None}  # fmt: skip
            channel.sendall(json.dumps(request).encode() + b"\n")
            return ForkedProcess(channel, args)
        except BaseException:
            channel.close()
            raise

    def _launch(self) -> None:
        if os.path.exists(self.path):
            os.unlink(self.path)
        with (self.directory / "forkserver.log").open("w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.support.forkserver", self.path],
                cwd=ROOT,
                env=worker_environment(),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        poll(lambda: os.path.exists(self.path) or self.proc.poll() is not None, timeout=60)
        assert self.proc.poll() is None, (self.directory / "forkserver.log").read_text()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def run_worker_command(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """`manage.py jobqueue_worker ARGS` to its end, forked by the fork server (what a fresh
    interpreter would do, without its start-up): its exit status, stdout and stderr."""
    directory = Path(tempfile.mkdtemp(prefix="jobqueue-command-"))
    out, err = directory / "stdout", directory / "stderr"
    process = fork_server().start(list(args), out, {}, err)
    try:
        returncode = process.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
        raise
    return subprocess.CompletedProcess(list(args), returncode, out.read_text(), err.read_text())


def worker_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a worker subprocess: the test database, and `extra`."""
    return {
        **os.environ,
        "JOBQUEUE_TEST_SUBPROCESS": "1",
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        **(extra or {}),
    }


_fork_server: ForkServer | None = None


def fork_server() -> ForkServer:
    """The session's fork server (made on first use)."""
    global _fork_server
    if _fork_server is None:
        directory = Path(tempfile.mkdtemp(prefix="jobqueue-forkserver-"))
        _fork_server = ForkServer(directory)
    return _fork_server


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _fork_server is not None:
        _fork_server.stop()


# Seconds stop() waits for a worker to register before it sends SIGTERM.
START_WAIT = 60.0

# Worker processes running at once in a lane, across its pytest-xdist processes: each holds
# about WORKER_CONNECTIONS server connections (dispatcher, completer, heartbeat, housekeeper,
# handlers; on PostgreSQL the listener and the maintainer too), and four test processes
# running worker-heavy tests side by side came within a dozen of PostgreSQL's default of 100
# (`max_connections`). The test processes, the fork server and the server's reserve keep
# RESERVED_CONNECTIONS. A worker that finds no slot within SLOT_WAIT seconds starts anyway:
# tests take their slots one worker at a time, so tests that each hold some and want more
# could otherwise wait for each other.
WORKER_CONNECTIONS = 8
RESERVED_CONNECTIONS = 25
SLOT_WAIT = 20.0


@functools.cache
def worker_slots() -> int | None:
    """How many worker processes may run at once in this lane (None: no bound, on SQLite)."""
    queries = {"postgresql": "SHOW max_connections", "mysql": "SELECT @@max_connections"}
    if connection.vendor not in queries:
        return None
    with connection.cursor() as cursor:
        cursor.execute(queries[connection.vendor])
        most = int(cursor.fetchone()[0])
    return max(2, (most - RESERVED_CONNECTIONS) // WORKER_CONNECTIONS)


class WorkerSlot:
    """One of the lane's `worker_slots()`: a file lock, which a test process that dies gives
    back with its other files."""

    def __init__(self) -> None:
        self._file: Any = None
        slots = worker_slots()
        if slots is None:
            return
        directory = Path(django_settings.STATE_DIR) / f"worker-slots-{connection.vendor}"
        directory.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + SLOT_WAIT
        while time.monotonic() < deadline:
            for number in range(slots):
                handle = (directory / f"slot-{number}").open("a")
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    handle.close()
                    continue
                self._file = handle
                return
            time.sleep(0.05)

    def release(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class WorkerProcess:
    """A `manage.py jobqueue_worker` process on the test database.

    Forked by the session's fork server, unless it needs variables other than those that
    only change JOBQUEUE (`forkserver.SETTINGS_ENV`), or `--reload`: then a subprocess of its
    own, `python -m django jobqueue_worker`.
    """

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log_path = log
        self.slot = WorkerSlot()  # given back once the process is seen to have exited
        self._log = log.open("w")
        self.proc: subprocess.Popen[bytes] | ForkedProcess
        try:
            if set(env or ()) <= SETTINGS_ENV and "--reload" not in args:
                self.proc = fork_server().start(args, log, env or {})
                return
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "django", "jobqueue_worker", *args],
                cwd=ROOT,
                env=worker_environment(env),
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except BaseException:
            self._log.close()
            self.slot.release()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 120.0) -> int:
        try:
            status = self.proc.wait(timeout)
            self.slot.release()
            return status
        except subprocess.TimeoutExpired as exc:
            self.kill()
            raise AssertionError(
                f"worker did not exit within {timeout}s:\n{self.output()}"
            ) from exc

    def row(self) -> Any:
        """This process's Worker row, or None."""
        from django_jobqueue.models import Worker

        return Worker.objects.filter(pid=self.pid).first()

    def wait_registered(self, timeout: float = 60.0) -> Any:
        """Return the Worker row once the process has registered (it is then claiming)."""

        def registered() -> Any:
            if not self.running():
                raise AssertionError(f"worker exited early:\n{self.output()}")
            return self.row()

        return poll(registered, timeout)

    def running(self) -> bool:
        if self.proc.poll() is None:
            return True
        self.slot.release()
        return False

    def stop(self, timeout: float = 120.0) -> int:
        """Send SIGTERM once the worker has registered, and return the exit status.

        A worker still starting (a fresh interpreter for `env=`, on a loaded machine several
        seconds) has no SIGTERM handler yet: the signal would kill it outright (status -15).
        Its handlers are installed before it registers, so the signal waits for its row, at
        most START_WAIT seconds (then it is sent all the same).
        """

        def started() -> bool:
            try:
                return not self.running() or self.row() is not None
            except DatabaseError:  # the database is down: signal it now, as ever
                return True

        if self.running():
            with contextlib.suppress(AssertionError):
                poll(started, timeout=START_WAIT)
        if self.running():
            self.signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                # Exited meanwhile, or a worker forked a moment ago that has no process group
                # of its own yet (its setsid() is its first step): kill the process itself.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.proc.pid, signal.SIGKILL)
            try:
                self.proc.wait(10)
            finally:
                self.slot.release()
        self.slot.release()

    def close(self) -> None:
        self._log.close()

    def output(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start worker subprocesses; any still running at the end of the test are killed."""
    started: list[WorkerProcess] = []
    assert connection.settings_dict["NAME"]  # the test database exists and is committed to

    def start(*args: str, env: dict[str, str] | None = None) -> WorkerProcess:
        worker = WorkerProcess(list(args), tmp_path / f"worker-{len(started)}.log", env)
        started.append(worker)
        return worker

    yield start
    for number, worker in enumerate(started):
        worker.kill()
        worker.close()
        # Shown by pytest only when the test failed: the tail of each worker's log.
        tail = "\n".join(worker.output().splitlines()[-40:])
        print(f"--- worker {number} (pid {worker.pid}, exit {worker.proc.returncode}) ---\n{tail}")


def in_new_thread[T](func: Callable[[], T]) -> T:
    """Run `func` in a new thread, hence on its own database connection and task backends."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = func()
        except BaseException as exc:
            outcome["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    assert not thread.is_alive()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


@pytest.fixture
def scenario() -> Any:
    """One job and worker of each kind an operator looks at (tests/support/admin_support.py)."""
    from tests.support import admin_support

    return admin_support.build()
