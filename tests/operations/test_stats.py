"""jobqueue_stats: --json checked against the table, --check exit codes, --watch, bad options."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_jobqueue import registry
from django_jobqueue.models import Job, Worker
from tests.conftest import ROOT, poll

pytestmark = pytest.mark.django_db(transaction=True)


def stats_json(*args: str) -> dict[str, Any]:
    out = StringIO()
    call_command("jobqueue_stats", "--json", *args, stdout=out)
    return json.loads(out.getvalue())


def make(state: str, **extra: Any) -> Job:
    final = state in Job.TERMINAL_STATES
    leased = state in Job.LEASED_STATES
    values: dict[str, Any] = {
        "type": "test.noop",
        "state": state,
        "finished_at": timezone.now() if final else None,
        "unique_slot": None if final else 1,
    }
    if leased:
        values.update(lease_owner="w1", lease_expires=timezone.now() + dt.timedelta(hours=1))
    values.update(extra)
    return Job.objects.create(**values)


def live_worker(queues: list[str] | None = None, *, alive: bool = True) -> Worker:
    now = timezone.now()
    return Worker.objects.create(
        id=f"host:1:{len(queues or [])}:{alive}",
        host="host",
        pid=1,
        queues=queues or [],
        concurrency=1,
        started_at=now,
        heartbeat_at=now,
        # Alive for an hour: a loaded machine can take minutes over a test's commands.
        expires_at=now + (dt.timedelta(hours=1) if alive else dt.timedelta(minutes=-10)),
        handlers=registry.keys(),  # what a real worker of this code lists
    )


def test_json_matches_the_table():
    make("ready", queue="default", group_key="a")
    make("ready", queue="mail", group_key="a")
    make("waiting", queue="mail")
    make("scheduled", run_after=timezone.now() + dt.timedelta(hours=1))
    make("running", group_key="b")
    make("leased", lease_expires=timezone.now() - dt.timedelta(minutes=10))  # long expired
    for _ in range(3):
        make("done")
    make("dead")
    make("ready", type="nobody.handles")
    live_worker(["default"])
    live_worker(["mail"], alive=False)

    figures = stats_json()

    expected = {state: Job.objects.filter(state=state).count() for state in Job.State.values}
    assert figures["states"] == expected
    assert set(figures["states"]) == set(Job.State.values)
    assert figures["states"]["cancelled"] == 0  # zeros included
    assert figures["queues"]["mail"]["ready"] == 1
    assert figures["queues"]["mail"]["waiting"] == 1
    assert figures["queues"]["default"]["ready"] == 2
    assert figures["groups"]["a"]["ready"] == 2
    assert figures["groups"]["b"]["running"] == 1
    assert figures["leases"] == {"in_flight": 2, "expired": 1, "expired_stale": 1}
    assert figures["workers"] == {"live": 1, "stale": 1, "gone": 0}
    assert figures["unserved_queues"] == {"mail": 1}
    assert figures["unknown_handlers"] == {"nobody.handles": 1}
    assert figures["oldest_ready_age"] is not None and 0 <= figures["oldest_ready_age"] < 600
    throughput = figures["throughput"]
    assert sum(row["done"] for row in throughput["per_minute"].values()) == 3
    assert sum(row["dead"] for row in throughput["per_minute"].values()) == 1
    assert throughput["finished_per_minute"] == round(4 / throughput["minutes"], 2)
    assert len(figures["problems"]) == 2  # the unserved queue, the stale lease


def test_empty_queue_has_every_state_at_zero_and_is_healthy():
    figures = stats_json()
    assert figures["states"] == dict.fromkeys(Job.State.values, 0)
    assert figures["oldest_ready_age"] is None
    assert figures["problems"] == []


ENV = {"DJANGO_SETTINGS_MODULE": "tests.settings", "JOBQUEUE_TEST_SUBPROCESS": "1"}


def run_check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "django", "jobqueue_stats", "--check", *args],
        cwd=ROOT,
        env={**os.environ, **ENV},
        capture_output=True,
        text=True,
        timeout=120,
    )


def check_in_process(*args: str) -> subprocess.CompletedProcess[str]:
    """Run `jobqueue_stats --check` here: its status is the SystemExit a process exits with."""
    out = StringIO()
    try:
        call_command("jobqueue_stats", "--check", *args, stdout=out)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    else:
        code = 0
    return subprocess.CompletedProcess(args, code, out.getvalue(), "")


def test_check_exit_codes():
    # The command's own process, for what a probe sees; then in this process (a process start
    # takes seconds on a loaded machine), for each reason to fail.
    assert run_check().returncode == 0  # nothing to do is healthy
    make("ready")
    result = run_check()
    assert result.returncode == 1, result.stdout
    assert "no live worker serves it" in result.stdout
    live_worker()  # serves every queue
    result = check_in_process()
    assert result.returncode == 0, result.stdout + result.stderr
    Job.objects.filter(state="ready").update(updated_at=timezone.now() - dt.timedelta(hours=1))
    result = check_in_process("--max-age", "60")
    assert result.returncode == 1
    assert "oldest ready job has waited" in result.stdout
    assert check_in_process("--max-age", "7200").returncode == 0
    make("running", lease_expires=timezone.now() - dt.timedelta(hours=1))
    assert check_in_process("--max-age", "7200").returncode == 1
    assert check_in_process("--max-age", "7200", "--max-expired", "1").returncode == 0
    result = check_in_process("--json", "--max-age", "7200")
    assert result.returncode == 1
    assert json.loads(result.stdout)["leases"]["expired_stale"] == 1


def test_text_output_and_watch_redraws():
    make("ready")
    out = StringIO()
    call_command("jobqueue_stats", stdout=out)
    text = out.getvalue()
    assert "ready" in text and "UNHEALTHY" in text
    output = watch_until(lambda out: out.count("\x1b[H\x1b[2J") >= 2, "--watch", "0.2")
    assert output.count("\x1b[H\x1b[2J") >= 2  # drawn more than once, in place


@pytest.mark.parametrize(
    "args",
    [
        ["--max-age", "x"],
        ["--max-age", "-1"],
        ["--max-expired", "1.5"],
        ["--minutes", "0"],
        ["--minutes", "1500000000"],  # was OverflowError: date value out of range
        ["--minutes", "99999999999999"],
        ["--watch", "0"],
        ["--watch", "1e300"],
        ["--watch", "1", "--check"],
    ],
)
def test_bad_options(args):
    with pytest.raises(CommandError):
        call_command("jobqueue_stats", *args, stdout=StringIO())


def test_workers_of_several_hosts_are_counted_and_serve_their_queues(start_worker):
    first = start_worker("--worker-id", "host-a:1", "--queue", "mail")
    second = start_worker("--worker-id", "host-b:1")
    first.wait_registered()
    second.wait_registered()
    figures = stats_json()
    assert figures["workers"] == {"live": 2, "stale": 0, "gone": 0}
    assert second.stop() == 0
    make("ready", queue="reports")
    figures = stats_json()
    assert figures["workers"] == {"live": 1, "stale": 0, "gone": 1}  # stopped: kept, not live
    assert figures["unserved_queues"] == {"reports": 1}
    assert first.stop() == 0


def watch_until(enough: Callable[[str], bool], *args: str) -> str:
    """Run jobqueue_stats with `args` until what it printed is `enough`; return that."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "django", "jobqueue_stats", *args],
        cwd=ROOT,
        env={**os.environ, **ENV},
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    chunks: list[bytes] = []

    def read() -> None:
        # A loaded machine can take seconds to start the command: read until it is stopped
        # rather than for a fixed time.
        while chunk := os.read(proc.stdout.fileno(), 65536):
            chunks.append(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        poll(lambda: enough(b"".join(chunks).decode(errors="replace")) or proc.poll() is not None)
    finally:
        proc.terminate()
        proc.wait(60)
        reader.join(60)
        proc.stdout.close()
    return b"".join(chunks).decode()


def test_watch_with_json_prints_one_object_per_line():
    output = watch_until(lambda out: out.count("\n") >= 2, "--watch", "0.2", "--json")
    lines = [line for line in output.split("\n")[:-1] if line]  # complete lines
    assert len(lines) >= 2
    assert all(json.loads(line)["states"]["ready"] == 0 for line in lines)


def test_lease_and_throughput_figures_read_their_indexes():
    """The lease counts read the lease index, the recent finishes the (state, finished_at) one."""
    from django.db import connection

    from django_jobqueue import conf, stats
    from django_jobqueue.dialects import get_dialect
    from tests.dialects.test_explain import analyze, explain_sql, statements_of

    now = timezone.now()
    Job.objects.bulk_create(
        (
            Job(type="test.noop", state="done", finished_at=now - dt.timedelta(minutes=i))
            for i in range(3000)
        ),
        batch_size=500,
    )
    Job.objects.bulk_create(Job(type="test.noop", state="ready") for _ in range(50))
    analyze()
    settings = conf.get()
    statements = statements_of(
        lambda: stats.collect(get_dialect("default"), lease_ttl=settings.lease_ttl)
    )
    column = connection.ops.quote_name("finished_at")
    [recent] = [s for s in statements if f"{column} >=" in s]
    used, _, plan = explain_sql(recent)
    assert "jobqueue_job_state_finished" in used, plan
    lease = connection.ops.quote_name("lease_expires")
    # The lease counts (the running jobs' progress is read through the same index).
    [leases] = [s for s in statements if f"{lease} IS NOT NULL" in s and "COUNT(" in s.upper()]
    used, _, plan = explain_sql(leases)
    assert "jobqueue_job_lease_expires" in used, plan


def test_unknown_handlers_are_those_no_live_worker_has():
    """Each worker lists its handlers: a type only an older or newer release has shows up."""
    make("ready", type="test.noop")
    row = live_worker(["default"])
    row.handlers = ["test.add"]
    row.save()
    assert stats_json()["unknown_handlers"] == {"test.noop": 1}
    make("ready", type="test.noop", queue="reports")  # no live worker takes "reports"
    out = StringIO()
    call_command("jobqueue_stats", stdout=out)
    text = out.getvalue()
    assert "Ready jobs no live worker serves: reports (1)" in text, text
    assert "2 ready or scheduled job(s) wait for a handler no live worker has: test.noop (2)" in (
        text
    ), text


def test_jobs_no_code_here_handles_are_listed_when_no_worker_is_live():
    """A task module no process imported leaves its jobs ready: the stats say so plainly."""
    make("ready", type="task:default:gone.module.func")
    make("ready", type="test.noop")  # registered in this process
    assert stats_json()["unknown_handlers"] == {"task:default:gone.module.func": 1}
    out = StringIO()
    call_command("jobqueue_stats", stdout=out)
    line = "1 ready or scheduled job(s) wait for a handler no code here registers: "
    assert line + "task:default:gone.module.func (1)" in out.getvalue(), out.getvalue()


def test_names_with_control_characters_are_printed_escaped():
    """Rows written before enqueue refused such names: a group cannot clear the screen or
    print a line of its own (a fake "Healthy.") in the operator's terminal."""
    Job.objects.create(type="test.noop", args={}, group_key="g\x1b[2J\x07", queue="q\rHealthy.")
    Job.objects.create(type="test.noop", args={}, queue="bidi\u202eq")
    out = StringIO()
    call_command("jobqueue_stats", stdout=out)
    text = out.getvalue()
    assert not any(c in text for c in "\x1b\x07\r\u202e"), repr(text)
    assert "g\\x1b[2J\\x07" in text
    assert "q\\rHealthy." in text
    assert "bidi\\u202eq" in text
    out = StringIO()
    call_command("jobqueue_stats", "--json", stdout=out)
    assert json.loads(out.getvalue())["groups"]["g\x1b[2J\x07"]  # JSON escapes on its own
