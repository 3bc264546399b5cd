"""unique_key under concurrent producers: one unfinished job per key, the same one for all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from django_jobqueue.models import Job
from tests.conftest import ROOT, poll

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PRODUCERS = 4
KEYS = [f"report:{n}" for n in range(20)]

# A producer process: set up Django on the test database, say it is ready, wait for the
# starting gun, then enqueue one job per key and print {key: the id enqueue() returned}.
PRODUCER = """
import json, os, sys, time
import django
django.setup()
import django_jobqueue as jobqueue
from django_jobqueue.models import Job
ready, go, keys = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
Job.objects.exists()  # connect before the race
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.002)
print(json.dumps({key: jobqueue.enqueue("test.noop", unique_key=key).pk for key in keys}))
"""


def test_concurrent_producers_get_one_job_per_key(tmp_path: Path):
    env = {
        **os.environ,
        "JOBQUEUE_TEST_SUBPROCESS": "1",
        "DJANGO_SETTINGS_MODULE": "tests.settings",
    }
    go = tmp_path / "go"
    procs = []
    for n in range(PRODUCERS):
        # Each producer walks the keys in its own order, so they collide on every key.
        keys = KEYS[n * 5 :] + KEYS[: n * 5]
        if n % 2:
            keys.reverse()
        ready = tmp_path / f"ready-{n}"
        procs.append(
            (
                ready,
                subprocess.Popen(
                    [sys.executable, "-c", PRODUCER, str(ready), str(go), json.dumps(keys)],
                    cwd=ROOT,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                ),
            )
        )

    def all_ready() -> bool:
        for _, proc in procs:
            if proc.poll() is not None:
                raise AssertionError(f"producer exited early:\n{proc.communicate()[1]}")
        return all(ready.exists() for ready, _ in procs)

    try:
        poll(all_ready, timeout=60)
        go.touch()
        results = []
        for _, proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for _, proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    # Every producer got the same job for each key ...
    assert all(result == results[0] for result in results), results
    assert set(results[0]) == set(KEYS)
    # ... which is the one unfinished job holding that key: nothing else was inserted.
    rows = list(Job.objects.values_list("unique_key", "pk", "state"))
    assert len(rows) == len(KEYS)
    assert {key: pk for key, pk, _ in rows} == results[0]
    assert {state for _, _, state in rows} == {"ready"}
