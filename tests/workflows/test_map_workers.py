"""ctx.map() with real worker processes: 500 items with concurrency=10 under 3 workers, the
parent's worker SIGKILLed inside the transaction that writes the children."""

from __future__ import annotations

from pathlib import Path

import pytest

import django_jobqueue as jobqueue
from django_jobqueue.models import Job, JobMap
from tests.conftest import poll, wait_for_job
from tests.support.workflow_support import FAST
from tests.testapp.durable_jobs import lines

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def most_at_once(marker: str) -> int:
    """The most children running at one instant, from their S (start) and E (end) lines."""
    running = most = 0
    for line in lines(marker):
        if line.startswith("S"):
            running += 1
            most = max(most, running)
        elif line.startswith("E"):
            running -= 1
    return most


def test_a_map_of_500_with_concurrency_10_under_3_workers_survives_a_kill_while_spawning(
    start_worker, tmp_path: Path
):
    marker = str(tmp_path / "calls")
    parent = jobqueue.enqueue(
        "map.killable", {"count": 500, "concurrency": 10, "marker": marker, "hold": 0.02}
    )
    workers = [start_worker("--concurrency", "4", *FAST) for _ in range(3)]
    # The parent's first run stops inside the map's transaction, after its first INSERT.
    poll(lambda: "spawning" in lines(marker), timeout=120)
    spawning = next(line for line in Path(marker).read_text().splitlines() if "spawning" in line)
    pid = int(spawning.split()[1])
    (doomed,) = [worker for worker in workers if worker.pid == pid]
    assert not Job.objects.filter(parent_id=parent.pk).exists()  # nothing committed
    doomed.kill()
    workers.append(start_worker("--concurrency", "4", *FAST))  # three workers again
    # Retried, it writes the children again, once, and waits for them holding no lease.
    waiting = poll(
        lambda: Job.objects.filter(
            pk=parent.pk, state=Job.State.WAITING, lease_owner__isnull=True
        ).first(),
        timeout=120,
    )
    assert waiting.lease_expires is None
    assert JobMap.objects.get(job_id=parent.pk).unfinished > 0  # it waits while they run
    done = wait_for_job(parent.pk, Job.State.DONE, Job.State.DEAD, timeout=600)
    assert done.state == Job.State.DONE, done.last_error
    assert done.result == {"results": [i * 2 for i in range(500)]}
    children = Job.objects.filter(parent_id=parent.pk)
    assert children.count() == 500
    assert set(children.values_list("state", flat=True)) == {Job.State.DONE}
    assert sorted(int(line[1:]) for line in lines(marker) if line.startswith("E")) == list(
        range(500)
    )
    most = most_at_once(marker)
    assert 1 <= most <= 10, most
    progress = JobMap.objects.get(job_id=parent.pk)
    assert (progress.total, progress.unfinished, progress.running) == (500, 0, 0)
    print(f"at most {most} children ran at once; parent took {done.finished_at - done.created_at}")
