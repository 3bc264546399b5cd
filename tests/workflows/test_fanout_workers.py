"""Fan-out with real worker processes: a wait for the first of three children returns once
the quickest is done, and with `cancel_rest` the two others end cancelled."""

from __future__ import annotations

from pathlib import Path

import pytest

import django_jobqueue as jobqueue
from django_jobqueue.models import Job
from tests.conftest import poll, wait_for_job
from tests.support.workflow_support import FAST
from tests.testapp.durable_jobs import lines

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def marker(tmp_path: Path) -> str:
    return str(tmp_path / "calls")


@pytest.mark.parametrize("cancel_rest", [False, True])
def test_wait_for_any_over_children_of_1_2_and_3_seconds_returns_after_the_first(
    start_worker, marker, cancel_rest
):
    sleeps = [["fanout.sleep", {"seconds": seconds}, {}] for seconds in (1, 2, 3)]
    parent = jobqueue.enqueue(
        "fanout.race",
        {"children": sleeps, "first": True, "cancel_rest": cancel_rest, "marker": marker},
        max_attempts=1,
    )
    start_worker("--concurrency", "4", *FAST)
    # While it waits, the parent holds no lease and has used no attempt.
    waiting = poll(lambda: Job.objects.filter(pk=parent.pk, state=Job.State.WAITING).first())
    assert (waiting.lease_owner, waiting.attempts) == (None, 0)
    poll(lambda: "returned" in lines(marker), timeout=90)
    done = wait_for_job(parent.pk, Job.State.DONE, Job.State.DEAD, timeout=90)
    assert done.state == Job.State.DONE, done.last_error
    one, two, three = done.result["spawned"]
    assert done.result["results"] == {str(one): 1}  # one result: the 1 s child's
    # It returned before the 3 s child was done.
    assert done.result["states_then"][str(three)] not in Job.TERMINAL_STATES
    finished = {pk: wait_for_job(pk, *Job.TERMINAL_STATES, timeout=90) for pk in (two, three)}
    expected = Job.State.CANCELLED if cancel_rest else Job.State.DONE
    assert [finished[pk].state for pk in (two, three)] == [expected, expected]
    assert Job.objects.get(pk=one).state == Job.State.DONE
    started = done.first_started_at
    print(f"cancel_rest={cancel_rest}: parent ran {done.finished_at - started} in all")
