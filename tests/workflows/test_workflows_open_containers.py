"""Containers left open: a producer killed inside container() no longer blocks its downstream.

The workers fail a container that is neither sealed nor given a child for
OPEN_CONTAINER_TIMEOUT; `jobqueue_stats` reports open containers that have been idle; an
operator seals one (the admin's Seal) to accept the children enqueued so far.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

import django_jobqueue as jobqueue
from django_jobqueue import containers
from django_jobqueue.dialects import get_dialect
from django_jobqueue.engine.enqueuing import create_container
from django_jobqueue.exceptions import ContainerNotSealed, InvalidJobError
from django_jobqueue.models import Job
from tests.conftest import ROOT, assert_clean_log, poll, wait_for_job
from tests.support import admin_support as support
from tests.support.admin_support import run_action, url

pytestmark = pytest.mark.django_db(transaction=True)

FINAL = Job.TERMINAL_STATES


def start_producer(tmp_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    """Start a producer that hangs inside container(); return it and its container's id."""
    out = tmp_path / "producer.out"
    env = {
        **os.environ,
        "JOBQUEUE_TEST_SUBPROCESS": "1",
        "DJANGO_SETTINGS_MODULE": "tests.settings",
    }
    with out.open("w") as stdout:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.open_container_producer"],
            cwd=ROOT,
            env=env,
            stdout=stdout,
            stderr=subprocess.STDOUT,
        )

    def printed() -> str | None:
        if proc.poll() is not None:
            raise AssertionError(f"producer exited early:\n{out.read_text()}")
        text = out.read_text().strip()
        return text if text.isdigit() else None

    try:
        return proc, int(poll(printed, timeout=120))
    except BaseException:
        proc.kill()
        raise


def backdate(*jobs: Job | int, seconds: float = 7200) -> None:
    """Make jobs look written, and created, `seconds` ago."""
    then = timezone.now() - dt.timedelta(seconds=seconds)
    pks = [j.pk if isinstance(j, Job) else j for j in jobs]
    Job.objects.filter(pk__in=pks).update(updated_at=then, created_at=then)


def fail_stale(idle_for: float = 3600) -> list[int]:
    return containers.fail_unsealed(get_dialect("default"), idle_for=idle_for, batch=100)


# -- a producer killed inside the block, real processes ---------------------------------------


def test_container_of_a_killed_producer_is_failed_then_sealed_by_hand(tmp_path, start_worker):
    producer, box_id = start_producer(tmp_path)
    after = jobqueue.enqueue("test.add", {"a": 2, "b": 2}, depends_on=[box_id])
    os.kill(producer.pid, signal.SIGKILL)
    assert producer.wait(30) == -signal.SIGKILL
    box = Job.objects.get(pk=box_id)
    assert (box.state, box.sealed) == ("waiting", False)  # never sealed: the block never exited
    [child] = Job.objects.filter(parent_id=box_id)

    worker = start_worker("--concurrency", "2", env={"JOBQUEUE_TEST_OPEN_CONTAINER_TIMEOUT": "2"})
    # Without the closer the container waits forever and this times out.
    box = wait_for_job(box_id, *FINAL, timeout=90)
    assert box.state == "dead" and box.sealed
    assert box.last_error["type"] == "django_jobqueue.exceptions.ContainerNotSealed"
    after.refresh_from_db()
    assert after.state == "cancelled" and after.cancelled_by_id == box_id
    assert wait_for_job(child.pk, *FINAL).state == "done"  # its children are left to run
    poll(lambda: "Failed 1 container(s) left open" in worker.output())

    # The operator accepts the child enqueued so far: the container is done, and the job
    # after it runs.
    assert containers.seal_open(box_id) == "done"
    done = wait_for_job(after.pk, *FINAL)
    assert (done.state, done.result, done.attempts) == ("done", 4, 1)
    assert worker.stop() == 0
    assert_clean_log(worker.output())


# -- the rule, in process -------------------------------------------------------------------


def test_open_container_is_failed_only_when_idle_for_the_timeout():
    busy = create_container("busy")
    child = jobqueue.enqueue("test.noop", parent=busy)
    down = jobqueue.enqueue("test.noop", depends_on=[busy])
    assert fail_stale() == []  # written just now
    backdate(busy)
    assert fail_stale() == []  # its child was added just now: the producer is alive
    backdate(child)
    assert fail_stale() == [busy.pk]
    assert fail_stale() == []  # failed once
    row = Job.objects.get(pk=busy.pk)
    assert (row.state, row.sealed) == ("dead", True)
    assert Job.objects.get(pk=down.pk).state == "cancelled"
    assert Job.objects.get(pk=child.pk).state == "ready"  # left alone
    # The producer's block then exits: it is told its container was failed.
    with pytest.raises(ContainerNotSealed, match=f"Container {busy.pk} was failed"):
        containers.seal(busy)


def test_block_exit_raises_when_its_container_was_failed_meanwhile():
    with pytest.raises(ContainerNotSealed), jobqueue.container("slow") as box:
        backdate(box)
        assert fail_stale() == [box.pk]
    assert Job.objects.get(pk=box.pk).state == "dead"


def test_sealed_and_finished_containers_are_never_failed():
    with jobqueue.container("sealed") as sealed:
        jobqueue.enqueue("test.noop", parent=sealed)
    with jobqueue.graph() as g:
        inner = g.container("graph")
        g.add("test.noop", parent=inner)
    with jobqueue.container("cancelled") as cancelled:
        pass
    Job.objects.filter(pk=cancelled.pk).update(sealed=False)
    jobqueue.cancel(jobqueue.enqueue("test.noop"))
    backdate(sealed, inner, cancelled)
    assert fail_stale() == []


def test_seal_open_seals_an_open_container_and_refuses_other_jobs():
    box = create_container("open")
    child = jobqueue.enqueue("test.noop", parent=box)
    assert containers.seal_open(box.pk) == "waiting"  # its child has not finished
    row = Job.objects.get(pk=box.pk)
    assert row.sealed and row.open_children == 1
    with pytest.raises(InvalidJobError, match="sealed container"):
        containers.seal_open(box.pk)
    with pytest.raises(InvalidJobError, match="not a container"):
        containers.seal_open(child.pk)
    empty = create_container("empty")
    assert containers.seal_open(empty) == "done"


# -- jobqueue_stats -------------------------------------------------------------------------


def stats_json(*args: str) -> dict[str, Any]:
    out = StringIO()
    call_command("jobqueue_stats", "--json", *args, stdout=out)
    return json.loads(out.getvalue())


def test_stats_show_open_containers_idle_past_the_threshold():
    fresh = create_container("fresh")
    idle = create_container("idle")
    backdate(idle, seconds=1200)
    figures = stats_json()
    opened = figures["open_containers"]
    assert opened["open"] == 2 and opened["idle"] == 1 and opened["idle_ids"] == [idle.pk]
    assert opened["oldest_age"] >= 1200
    [problem] = figures["problems"]
    assert problem.startswith("1 open container(s) not sealed and idle for more than 600s")
    assert problem.endswith(str(idle.pk))
    # A longer threshold tolerates it.
    assert stats_json("--max-open-idle", "3600")["problems"] == []
    out = StringIO()
    call_command("jobqueue_stats", stdout=out)
    text = out.getvalue()
    assert "Open containers: 2 not sealed (oldest opened" in text
    assert f"1 idle past the threshold: {idle.pk}" in text
    assert "UNHEALTHY" in text
    assert fresh.pk not in stats_json("--max-open-idle", "60")["open_containers"]["idle_ids"]


# -- the admin ------------------------------------------------------------------------------


@pytest.fixture
def operator(settings: Any) -> Any:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    return support.login(support.make_user("operator", "view_job", "change_job"))


def test_admin_page_of_an_open_container_explains_it_and_seals_it(operator):
    box = create_container("open")
    child = jobqueue.enqueue("test.noop", parent=box)
    Job.objects.filter(pk=child.pk).update(
        state="done", finished_at=timezone.now(), unique_slot=None
    )
    after = jobqueue.enqueue("test.noop", depends_on=[box])
    page = operator.get(url("job_change", box.pk)).content.decode()
    assert "Open (not sealed)" in page
    assert 'value="seal_containers"' in page and 'value="cancel_jobs"' in page

    status, messages = run_action(operator, "job", "seal_containers", [box.pk, child.pk])
    assert status == 200
    [text] = messages
    assert text.startswith(f"Sealed 1 job (#{box.pk} done)")
    assert f"#{child.pk}: it is not a container" in text
    assert Job.objects.get(pk=box.pk).state == "done"
    assert Job.objects.get(pk=after.pk).state == "ready"


def test_admin_seals_a_container_failed_as_not_sealed(operator):
    box = create_container("failed")
    child = jobqueue.enqueue("test.noop", parent=box)
    after = jobqueue.enqueue("test.noop", depends_on=[box])
    backdate(box, child)
    assert fail_stale() == [box.pk]
    page = operator.get(url("job_change", box.pk)).content.decode()
    assert "Failed because it was never sealed" in page
    assert 'value="seal_containers"' in page

    run_action(operator, "job", "seal_containers", [box.pk])
    row = Job.objects.get(pk=box.pk)
    assert (row.state, row.sealed, row.open_children) == ("waiting", True, 1)
    assert Job.objects.get(pk=after.pk).state == "waiting"  # revived: waits for the container


def test_view_only_user_cannot_seal(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    client = support.login(support.make_user("viewer", "view_job"))
    box = create_container("open")
    page = client.get(url("job_change", box.pk)).content.decode()
    assert 'value="seal_containers"' not in page
    run_action(client, "job", "seal_containers", [box.pk])
    assert Job.objects.get(pk=box.pk).sealed is False
