"""Job log lines with real worker processes: sync and async handlers keep each attempt's lines
(and the worker's logging shows them), the default cap holds, and a worker killed mid-run
loses only the lines not written yet (the ones since its last recorded step)."""

from __future__ import annotations

from pathlib import Path

import pytest

import django_jobqueue as jobqueue
from django_jobqueue.models import Job, JobLogLine
from tests.conftest import assert_clean_log, poll, wait_for_job
from tests.support.workflow_support import FAST
from tests.testapp.durable_jobs import lines

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SHORT_LEASE = ("--lease-ttl", "2", "--heartbeat-interval", "0.5", *FAST)


def kept(job: Job) -> list[tuple[int, str, str]]:
    rows = JobLogLine.objects.filter(job_id=job.pk).order_by("pk")
    return [(row.attempt, row.level_name, row.message) for row in rows]


def test_sync_and_async_handlers_keep_each_attempts_lines(start_worker):
    sync = jobqueue.enqueue("logs.retried", {"fail_until": 1}, max_attempts=2)
    async_ = jobqueue.enqueue("logs.aretried", {"fail_until": 1}, max_attempts=2)
    worker = start_worker("--concurrency", "2", *FAST)
    for job in (sync, async_):
        done = wait_for_job(job.pk, Job.State.DONE, Job.State.DEAD)
        assert done.state == Job.State.DONE, done.last_error
    sync_lines = kept(sync)
    assert [(a, level) for a, level, _ in sync_lines] == [
        (1, "INFO"), (1, "WARNING"), (1, "ERROR"), (2, "INFO"), (2, "WARNING"), (2, "INFO"),
    ]  # fmt: skip
    assert sync_lines[2][2].endswith("ValueError: boom on attempt 1")
    assert kept(async_) == [
        (1, "INFO", "async attempt 1 begins"),
        (1, "WARNING", "async <b>bold</b> after the step"),
        (2, "INFO", "async attempt 2 begins"),
        (2, "WARNING", "async <b>bold</b> after the step"),
        (2, "INFO", "async done on attempt 2"),
    ]
    worker.stop()
    output = worker.output()
    # The project's logging shows them too (tests/settings.py: django_jobqueue at INFO).
    assert "async done on attempt 2" in output
    assert f"starting attempt 2 of job {sync.pk}" in output
    assert "Could not store" not in output


def test_an_attempt_keeps_the_default_cap_of_lines_and_of_characters(start_worker):
    job = jobqueue.enqueue("logs.flood", {"count": 1005, "long": 3000})
    worker = start_worker(*FAST)
    done = wait_for_job(job.pk, Job.State.DONE, Job.State.DEAD)
    assert done.state == Job.State.DONE, done.last_error
    lines_kept = kept(job)
    assert len(lines_kept) == 1001
    assert [m for _, _, m in lines_kept[:1000]] == [f"line {n}" for n in range(1000)]
    assert lines_kept[1000] == (
        1,
        "WARNING",
        "6 lines dropped: an attempt keeps 1000 (JOBQUEUE['JOB_LOG_MAX_LINES'])",
    )
    worker.stop()
    assert_clean_log(worker.output())


def test_a_long_line_is_cut_to_the_default_length(start_worker):
    job = jobqueue.enqueue("logs.flood", {"count": 0, "long": 3000})
    worker = start_worker(*FAST)
    wait_for_job(job.pk, Job.State.DONE)
    [(_, _, message)] = kept(job)
    assert message == "x" * 1999 + "…"
    worker.stop()


@pytest.mark.parametrize("key", ["logs.crashes", "logs.acrashes"])
def test_a_killed_worker_loses_only_the_lines_after_its_last_step(
    start_worker, tmp_path: Path, key: str
):
    marker = str(tmp_path / "calls")
    job = jobqueue.enqueue(key, {"marker": marker}, max_attempts=3)
    doomed = start_worker(*SHORT_LEASE)
    poll(lambda: lines(marker) == ["holding"])
    prefix = "async " if key == "logs.acrashes" else ""
    # Written with the step: the line before it; the one after it waits in memory.
    assert kept(job) == [(1, "INFO", f"{prefix}before the step, attempt 1")]
    doomed.kill()
    start_worker(*SHORT_LEASE)
    done = wait_for_job(job.pk, Job.State.DONE, Job.State.DEAD, timeout=90)
    assert done.state == Job.State.DONE, done.last_error
    assert kept(job) == [
        (1, "INFO", f"{prefix}before the step, attempt 1"),
        (2, "INFO", f"{prefix}before the step, attempt 2"),  # the step is replayed: no write
        (2, "INFO", f"{prefix}after the step, attempt 2"),
    ]


def test_a_timed_out_attempt_keeps_the_lines_it_logged(start_worker):
    """The worker records the timeout while the handler still runs: the lines kept by then
    are written with that outcome."""
    job = jobqueue.enqueue("logs.hangs", timeout=1, max_attempts=1)
    start_worker(*FAST)
    dead = wait_for_job(job.pk, Job.State.DEAD)
    assert dead.last_error["type"].endswith("JobTimeout")
    assert kept(job) == [(1, "WARNING", "about to hang")]
