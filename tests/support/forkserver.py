"""A fork server for the tests' worker processes: Django is set up once, each worker is a fork.

Starting `python -m django jobqueue_worker` costs an interpreter and a Django set-up (about
0.6 s of CPU, twice that under coverage) and the suite starts hundreds of workers. This
server, started once per test session (`tests/conftest.py`), sets Django up with the settings
a worker subprocess gets, then forks a child for each request. The child is what a worker
subprocess is: a new session (its own process group), stdout and stderr to its log file,
`execute_from_command_line(["django", "jobqueue_worker", ...])`, the interpreter's own exit
(atexit handlers, coverage's included). Only its start differs: what it imports is imported
already. A worker may bring variables that only change `JOBQUEUE` (limits, schedules,
retention: `SETTINGS_ENV`): the child sets them and reads `JOBQUEUE` from the settings
module again before the command starts, as a fresh interpreter would have. Workers that need
any other variable (a database URL, a module that registers handlers at import) or `--reload`
(which re-executes sys.argv) are started as real subprocesses instead.

Protocol, over a Unix socket, one connection per child: the client sends one JSON line
{"args": [...], "log": path, "cwd": path, "env": {...}, "err": path or absent (stderr with
stdout in `log`)}; the server answers "pid N" at once,
and "exit CODE" when the child has exited (CODE as subprocess gives it: -N for signal N).
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import json
import os
import select
import signal
import socket
import sys
from typing import Any

# The variables tests/settings.py turns into JOBQUEUE alone (read by nothing else at import),
# and two read by the running worker itself: a forked worker can take these.
SETTINGS_ENV = frozenset(
    {
        *(
            f"JOBQUEUE_TEST_{name}"
            for name in (
                "BACKOFF", "GROUP_LIMITS", "QUEUE_LIMITS", "SCHEDULES", "RATE_LIMITS",
                "MAINTENANCE", "LIMITS", "CLOCK_FILE", "DYNAMIC_LIMIT", "RETENTION",
                "OPEN_CONTAINER_TIMEOUT", "STUCK_FILE",
            )
        ),
        "PYTHONFAULTHANDLER",
    }
)  # fmt: skip


def _apply_env(env: dict[str, str]) -> None:
    """In the child: take `env` (names in SETTINGS_ENV) as a fresh interpreter would."""
    unknown = set(env) - SETTINGS_ENV
    assert not unknown, f"not for a forked worker: {sorted(unknown)}"
    os.environ.update(env)
    if os.environ.get("PYTHONFAULTHANDLER"):
        faulthandler.enable()
    from django.conf import settings

    module = importlib.reload(importlib.import_module(os.environ["DJANGO_SETTINGS_MODULE"]))
    # A new object: django_jobqueue.conf validates JOBQUEUE again when its identity changes.
    settings.JOBQUEUE = module.JOBQUEUE


def _preload() -> None:
    import django

    django.setup()
    # What every worker imports, so that no child imports it again.
    import django_jobqueue.management.commands.jobqueue_worker
    import django_jobqueue.worker
    import django_jobqueue.worker.reclaimer  # noqa: F401


def _run_child(request: dict[str, Any]) -> None:
    """In the forked child: become the worker; never returns."""
    os.setsid()
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    if request.get("err"):  # stderr to a file of its own
        err = os.open(request["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(err, 2)
        os.close(err)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.chdir(request["cwd"])
    if request.get("env"):
        _apply_env(request["env"])
    from django.core.management import execute_from_command_line

    sys.argv = ["django", "jobqueue_worker", *request["args"]]
    execute_from_command_line(sys.argv)
    sys.exit(0)  # SystemExit unwinds main() (which catches nothing) to the interpreter's exit


def main(path: str) -> None:
    _preload()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # Bound under another name and renamed once listening: the client waits for `path` to
    # exist, and a socket file that exists before listen() refuses connections.
    server.bind(f"{path}.new")
    server.listen(64)
    os.rename(f"{path}.new", path)
    parent = os.getppid()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    children: dict[int, socket.socket] = {}
    while os.getppid() == parent:  # the test session is gone: leave
        try:
            readable = select.select([server, wake_r], [], [], 1.0)[0]
        except InterruptedError:
            readable = []
        if wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if not pid:
                break
            client = children.pop(pid, None)
            if client is not None:
                with contextlib.suppress(OSError):
                    client.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
                client.close()
        if server in readable:
            client, _ = server.accept()
            request = json.loads(client.makefile("r").readline())
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for held in (server, client, *children.values()):
                    held.close()
                os.close(wake_r)
                os.close(wake_w)
                _run_child(request)
            children[pid] = client
            client.sendall(f"pid {pid}\n".encode())


if __name__ == "__main__":
    main(sys.argv[1])
