"""Workers SIGKILLed at random while they drain thousands of jobs: nothing lost, nothing
finalized twice, every job in its expected state."""

from __future__ import annotations

import time

import pytest

from tests.chaos.support import (
    Supervisor,
    audit,
    build_workload,
    check_log,
    describe_unfinished,
    env_int,
    log_trouble,
    seeded_random,
    unfinished,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.chaos, pytest.mark.slow]

# A short lease so that the jobs of a killed worker come back within seconds.
WORKER_ARGS = ("--concurrency", "4", "--lease-ttl", "3", "--heartbeat-interval", "1")


def test_killing_workers_at_random_loses_nothing_and_finalizes_nothing_twice(
    start_worker, chaos_report
):
    rnd, seed = seeded_random()
    work = build_workload(
        rnd,
        independent=env_int("JOBQUEUE_CHAOS_JOBS", 2000),
        boxes=env_int("JOBQUEUE_CHAOS_BOXES", 8),
        per_box=40,
    )
    started = time.monotonic()
    supervisor = Supervisor(start_worker, env_int("JOBQUEUE_CHAOS_WORKERS", 3), WORKER_ARGS)
    max_kills = env_int("JOBQUEUE_CHAOS_KILLS", 12)
    deadline = started + env_int("JOBQUEUE_CHAOS_TIMEOUT", 400)
    next_kill = time.monotonic() + rnd.uniform(1.5, 3.0)
    left = len(work.ids)
    # Kills come on a timer, and also each time another share of the jobs is done: however
    # fast the workers drain (forked workers start at once), they meet several kills.
    share = max(1, left // (max_kills + 2))
    kill_below = left - share
    while left:
        assert time.monotonic() < deadline, describe_unfinished(work.ids)
        supervisor.assert_healthy()
        # Kill only while there is work to lose; the last kills leave time to recover.
        due = time.monotonic() >= next_kill or left <= kill_below
        if supervisor.kills < max_kills and due and left > 50:
            supervisor.kill_one(rnd)
            next_kill = time.monotonic() + rnd.uniform(1.0, 3.0)
            kill_below = left - share
        time.sleep(0.25)
        left = unfinished(work.ids)
    elapsed = time.monotonic() - started
    everyone = supervisor.workers + supervisor.killed
    skipped_beats = sum(log_trouble(worker.output())[1] for worker in everyone)

    result = audit(work)
    line = chaos_report(
        "kill-9",
        jobs=result.jobs,
        workers=len(supervisor.workers),
        kills=supervisor.kills,
        restarts=supervisor.restarts,
        re_runs=result.reruns,
        reclaimed=result.reclaimed,
        lost=result.lost,
        skipped_beats=skipped_beats,
        seconds=round(elapsed),
        seed=seed,
    )
    assert not result.problems, "\n".join([line, *result.problems[:30]])
    assert result.lost == 0
    assert supervisor.kills >= 3, line
    # The kills hit workers holding jobs: some leases expired and were taken back.
    assert result.reclaimed > 0, line
    assert supervisor.stop_all() == [0] * len(supervisor.workers)
    for worker in everyone:
        check_log(worker)
