"""Gone workers stay listed (issue 51): a worker that stops, or is found dead, stays on the
Workers page for an hour with when it went and how many of its jobs were taken back, and no
reader of liveness counts it."""

from __future__ import annotations

import pytest
from django.test import Client

import django_jobqueue as jobqueue
from django_jobqueue import conf
from django_jobqueue.dialects import get_dialect
from django_jobqueue.engine.control import owner_alive
from django_jobqueue.models import Job, Worker
from django_jobqueue.worker.reclaimer import any_reclaimable
from tests.conftest import poll
from tests.support.admin_support import url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SHORT_LEASE = ("--lease-ttl", "2", "--heartbeat-interval", "0.5")


def listed(client: Client, worker_id: str) -> str:
    """The row of `worker_id` on the Workers page."""
    html = client.get(url("worker_changelist")).content.decode()
    return html.split(f">{worker_id}<")[1].split("</tr>")[0]


def test_killed_worker_stays_listed_as_gone_with_its_reclaimed_jobs(
    start_worker, admin_client: Client
) -> None:
    ids = [jobqueue.enqueue("test.record", {"sleep": 60}).pk for _ in range(2)]
    doomed = start_worker("--concurrency", "2", *SHORT_LEASE)
    doomed_id = doomed.wait_registered().id
    poll(lambda: Job.objects.filter(state=Job.State.RUNNING, lease_owner=doomed_id).count() == 2)
    # It serves another queue: it reclaims the jobs (the killed process is provably gone from
    # this host, or its row expires) but never runs them.
    survivor = start_worker("--queue", "elsewhere", *SHORT_LEASE)
    survivor_id = survivor.wait_registered().id
    doomed.kill()

    gone = poll(lambda: Worker.objects.gone().filter(pk=doomed_id).first(), timeout=60)
    poll(lambda: Worker.objects.get(pk=doomed_id).jobs_reclaimed == 2, timeout=60)
    states = set(Job.objects.filter(pk__in=ids).values_list("state", flat=True))
    assert states <= {Job.State.READY, Job.State.SCHEDULED}  # back in the queue, not run
    assert gone.job_ids == [] and gone.expires_at <= gone.gone_at
    assert not owner_alive(doomed_id)
    assert not any_reclaimable(get_dialect(conf.get().database), [])
    row = listed(admin_client, doomed_id)
    assert "gone at <time" in row and "2 jobs reclaimed" in row, row
    assert "ran " in row and "0 done, 0 failed" in row, row
    live = listed(admin_client, survivor_id)
    assert "alive" in live and "gone at" not in live

    assert survivor.stop() == 0
    stopped = Worker.objects.get(pk=survivor_id)
    assert stopped.gone_at is not None and stopped.jobs_reclaimed == 0
    assert "gone at <time" in listed(admin_client, survivor_id)
    assert "0 jobs reclaimed" in listed(admin_client, survivor_id)
    assert not Worker.objects.live().exists()
    page = admin_client.get(url("worker_changelist") + "?status=gone").content.decode()
    assert doomed_id in page and survivor_id in page
    page = admin_client.get(url("worker_changelist") + "?status=live").content.decode()
    assert doomed_id not in page


def test_worker_id_given_again_starts_a_new_row(start_worker) -> None:
    first = start_worker("--worker-id", "again", *SHORT_LEASE)
    started = first.wait_registered().started_at
    assert first.stop() == 0
    assert Worker.objects.gone().filter(pk="again").exists()
    second = start_worker("--worker-id", "again", *SHORT_LEASE)
    row = poll(lambda: Worker.objects.live().filter(pk="again").first(), timeout=60)
    assert row.started_at > started and row.jobs_reclaimed == 0
    assert second.stop() == 0
