"""Signal receivers for worker subprocesses: one JSON line per signal in a file.

Connected when JOBQUEUE_TEST_SIGNAL_LOG names the file (see tests/worker/test_signals.py); with
JOBQUEUE_TEST_SIGNAL_RAISE set, another receiver raises on every signal, first.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from django_jobqueue import signals

SIGNALS = {
    "enqueued": signals.job_enqueued,
    "started": signals.job_started,
    "finished": signals.job_finished,
    "failed": signals.job_failed,
    "dead": signals.job_dead,
}
_lock = threading.Lock()


def _writer(name: str) -> Any:
    def receive(sender: Any, **kwargs: Any) -> None:
        record = {
            "signal": name,
            "sender": sender.__name__,
            "thread": threading.current_thread().name,
        }
        for key, value in kwargs.items():
            if key == "signal":
                continue  # Django passes the Signal itself
            if key == "error":
                value = f"{type(value).__name__}: {value}"
            elif key == "job":
                value = value.pk
            record[key] = value
        with _lock, open(os.environ["JOBQUEUE_TEST_SIGNAL_LOG"], "a") as log:
            log.write(json.dumps(record, default=str) + "\n")

    return receive


def _raise(sender: Any, **kwargs: Any) -> None:
    raise RuntimeError("a receiver that raises")


_receivers = {name: _writer(name) for name in SIGNALS}


def connect() -> None:
    """Connect the receivers the environment asks for."""
    for name, signal in SIGNALS.items():
        if os.environ.get("JOBQUEUE_TEST_SIGNAL_RAISE"):
            signal.connect(_raise, dispatch_uid=f"test-raise-{name}")
        signal.connect(_receivers[name], dispatch_uid=f"test-log-{name}")


if os.environ.get("JOBQUEUE_TEST_SIGNAL_LOG"):
    connect()
