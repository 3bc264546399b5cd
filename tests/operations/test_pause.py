"""Queue pause: jobqueue_pause / jobqueue_resume, and workers that stop claiming a paused
queue's jobs while its running jobs finish."""

from __future__ import annotations

import time
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

import django_jobqueue as jobqueue
from django_jobqueue.exceptions import InvalidJobError
from django_jobqueue.models import Job, QueueState
from django_jobqueue.pausing import pause_queue, paused_queues, resume_queue
from tests.conftest import assert_clean_log, poll, wait_for_job
from tests.support.workflow_support import FAST, run_burst

pytestmark = pytest.mark.django_db(transaction=True)


def command(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_pause_and_resume_record_the_state_and_say_what_changed():
    assert pause_queue("emails") is True
    assert pause_queue("emails") is False
    state = QueueState.objects.get(name="emails")
    assert state.paused and state.paused_at is not None
    assert paused_queues() == ("emails",)
    assert resume_queue("emails") is True
    assert resume_queue("emails") is False
    assert resume_queue("never-paused") is False
    assert paused_queues() == ()
    with pytest.raises(InvalidJobError, match="queue must be a non-empty string"):
        pause_queue("")


def test_commands_pause_and_resume_several_queues():
    assert command("jobqueue_pause", "a", "b") == "Paused queue 'a'.\nPaused queue 'b'.\n"
    assert command("jobqueue_pause", "a") == "Queue 'a' was paused already.\n"
    assert paused_queues() == ("a", "b")
    assert command("jobqueue_resume", "a", "c") == (
        "Resumed queue 'a'.\nQueue 'c' was not paused.\n"
    )
    assert paused_queues() == ("b",)


def test_a_bad_queue_name_writes_nothing():
    with pytest.raises(CommandError, match="at most 100 characters"):
        call_command("jobqueue_pause", "ok", "x" * 101)
    with pytest.raises(CommandError, match="non-empty"):
        call_command("jobqueue_resume", "")
    assert not QueueState.objects.exists()


def test_a_worker_claims_nothing_from_a_paused_queue_until_it_is_resumed():
    pause_queue("held")
    held = [jobqueue.enqueue("test.noop", queue="held") for _ in range(3)]
    other = jobqueue.enqueue("test.noop")
    assert run_burst() == 0
    assert Job.objects.get(pk=other.pk).state == Job.State.DONE
    assert set(Job.objects.filter(queue="held").values_list("state", "attempts")) == {("ready", 0)}
    resume_queue("held")
    assert run_burst() == 0
    assert {wait_for_job(j.pk, "done").state for j in held} == {"done"}


@pytest.mark.slow
def test_running_jobs_finish_and_nothing_more_is_claimed_while_paused(start_worker):
    """A worker subprocess: jobs running when their queue is paused finish; the queue's new
    jobs stay ready while the worker keeps running other queues; resume lets them run."""
    worker = start_worker("--concurrency", "2", *FAST)
    worker.wait_registered()
    running = [jobqueue.enqueue("test.sleep", {"seconds": 1.5}, queue="work") for _ in range(2)]
    for job in running:
        wait_for_job(job.pk, "running")
    call_command("jobqueue_pause", "work", stdout=StringIO())
    time.sleep(1.5)  # the worker reads the paused queues every FAIR_SHARE_REFRESH (1 s)
    # A claim that began before the refresh could still be under way, however long a loaded
    # machine stalls it: once a job enqueued now is done, every later claim has read the pause.
    probe = jobqueue.enqueue("test.noop")
    for job in [*running, probe]:
        wait_for_job(job.pk, "done")
    waiting = [jobqueue.enqueue("test.noop", queue="work") for _ in range(3)]
    others = [jobqueue.enqueue("test.noop") for _ in range(3)]
    for job in others:
        wait_for_job(job.pk, "done")
    time.sleep(1.0)  # several more polls
    assert set(
        Job.objects.filter(pk__in=[j.pk for j in waiting]).values_list("state", "attempts")
    ) == {("ready", 0)}
    call_command("jobqueue_resume", "work", stdout=StringIO())
    for job in waiting:
        wait_for_job(job.pk, "done", timeout=30)
    assert worker.stop() == 0
    assert_clean_log(worker.output())
    assert poll(lambda: not Job.objects.exclude(state=Job.State.DONE).exists())
