"""Proving a worker's process gone on its host (worker/processes.py), and taking its leases back.

Real processes of this host: a child that exits is gone, a live one is not, a pid whose start
differs was reused; identities of another boot or pid namespace are never judged.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys

import pytest
from django.utils import timezone

import django_jobqueue as jobqueue
from django_jobqueue.dialects import get_dialect
from django_jobqueue.engine import leases
from django_jobqueue.models import Job, Worker
from django_jobqueue.worker import processes
from django_jobqueue.worker.reclaimer import reclaim_gone_on_host

pytestmark = pytest.mark.skipif(
    not processes.host(), reason="needs Linux's /proc (elsewhere nothing is judged)"
)


def identity_of(proc: subprocess.Popen) -> str:
    return f"{processes.host()}:{proc.pid}:{processes._start_ticks(proc.pid)}"


@pytest.fixture
def child():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_live_process_is_not_gone_and_an_ended_one_is(child):
    me = processes.identity()
    assert me.startswith(processes.host() + f":{os.getpid()}:")
    assert not processes.gone(me)
    identity = identity_of(child)
    assert not processes.gone(identity)
    child.kill()
    child.wait()
    assert processes.gone(identity)


def test_a_pid_that_another_process_took_is_gone(child):
    pid, start = identity_of(child).rsplit(":", 2)[1:]
    assert processes.gone(f"{processes.host()}:{pid}:{int(start) + 1}")


def test_nothing_is_judged_of_another_boot_namespace_or_an_unknown_identity(child):
    child.kill()
    child.wait()
    boot, namespace = processes.host().split(":", 1)
    tail = f"{child.pid}:1"  # an ended process: gone, were it of this namespace
    assert processes.gone(f"{processes.host()}:{tail}")
    assert not processes.gone(f"{boot}:pid:[1]:{tail}")  # a container's pid namespace
    assert not processes.gone(f"another-boot:{namespace}:{tail}")
    assert not processes.gone("")
    assert not processes.gone(f"{processes.host()}:not-a-pid")


def register(worker_id: str, process_key: str, job_ids: list[int]) -> None:
    now = timezone.now()
    Worker.objects.create(
        id=worker_id,
        host="h",
        pid=1,
        process_key=process_key,
        concurrency=1,
        started_at=now,
        heartbeat_at=now,
        lease_ttl=30.0,
        expires_at=now + dt.timedelta(seconds=30),
        job_ids=job_ids,
    )


@pytest.mark.django_db(transaction=True)
def test_the_leases_of_a_gone_worker_of_this_host_are_taken_back_at_once(child):
    dialect = get_dialect("default")
    gone_job, kept_job = jobqueue.enqueue("test.noop"), jobqueue.enqueue("test.noop")
    [first] = leases.claim(dialect, owner="gone", queues=[], limit=1, lease_ttl=30.0)
    [second] = leases.claim(dialect, owner="boxed", queues=[], limit=1, lease_ttl=30.0)
    identity = identity_of(child)
    boot, _ = processes.host().split(":", 1)
    register("gone", identity, [first.pk])
    register("boxed", f"{boot}:pid:[1]:{identity.rsplit(':', 2)[1]}:1", [second.pk])
    assert reclaim_gone_on_host(dialect, batch=10, me="me") == []  # alive: nothing taken
    child.kill()
    child.wait()
    assert reclaim_gone_on_host(dialect, batch=10, me="me") == [(first.pk, Job.State.SCHEDULED)]
    row = Job.objects.get(pk=first.pk)
    assert (row.state, row.lease_owner) == (Job.State.SCHEDULED, None)
    assert "found its process gone" in row.last_error["message"]
    assert Worker.objects.gone().get(pk="gone").jobs_reclaimed == 1
    assert Job.objects.get(pk=second.pk).state == Job.State.RUNNING  # another namespace
    assert {gone_job.pk, kept_job.pk} == {first.pk, second.pk}
