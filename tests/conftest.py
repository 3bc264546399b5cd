"""Shared fixtures: the database under test, and worker subprocesses that use it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


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


class WorkerProcess:
    """A `manage.py jobqueue_worker` subprocess on the test database."""

    def __init__(self, args: list[str], log: Path) -> None:
        env = {
            **os.environ,
            "JOBQUEUE_TEST_SUBPROCESS": "1",
            "DJANGO_SETTINGS_MODULE": "tests.settings",
        }
        self.log_path = log
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "django", "jobqueue_worker", *args],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 120.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            self.kill()
            raise AssertionError(
                f"worker did not exit within {timeout}s:\n{self.output()}"
            ) from exc

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text()


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start worker subprocesses; any still running at the end of the test are killed."""
    started: list[WorkerProcess] = []
    assert connection.settings_dict["NAME"]  # the test database exists and is committed to

    def start(*args: str) -> WorkerProcess:
        worker = WorkerProcess(list(args), tmp_path / f"worker-{len(started)}.log")
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.kill()
