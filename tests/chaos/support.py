"""The chaos suite's tools: a workload with known outcomes, a supervisor, and the audit."""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import subprocess
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

from django.db import InterfaceError, OperationalError, connection

import django_jobqueue as jobqueue
from django_jobqueue.models import Job, JobDependency
from tests.conftest import SKIPPED_BEAT, TROUBLE, WorkerProcess, poll
from tests.testapp.models import RunRecord

LEASE_EXPIRED = "django_jobqueue.exceptions.LeaseExpired"
FAIL = "django_jobqueue.exceptions.Fail"
FLAKY = "builtins.RuntimeError"
UPSTREAM_FAILED = "django_jobqueue.exceptions.UpstreamFailed"
# Attempts to spare: a job whose worker is killed under it is charged one each time.
MAX_ATTEMPTS = 25


def env_int(name: str, default: int) -> int:
    """An integer from the environment (sizes a chaos run), or `default`."""
    return int(os.environ.get(name) or default)


def seeded_random() -> tuple[random.Random, int]:
    """A random generator and its seed (JOBQUEUE_CHAOS_SEED repeats a run's choices)."""
    seed = env_int("JOBQUEUE_CHAOS_SEED", random.SystemRandom().randrange(10**6))
    return random.Random(seed), seed


@dataclasses.dataclass
class Workload:
    """Jobs enqueued for a chaos run, each with the state it must end in."""

    expected: dict[int, str] = dataclasses.field(default_factory=dict)
    flaky: set[int] = dataclasses.field(default_factory=set)  # designed to run twice

    @property
    def ids(self) -> list[int]:
        return list(self.expected)

    def add(self, jobs: list[Job], state: str) -> None:
        for job in jobs:
            self.expected[int(job.pk)] = state


def build_workload(rnd: random.Random, independent: int, boxes: int, per_box: int) -> Workload:
    """Enqueue `independent` jobs and a DAG of `boxes` containers of `per_box` children.

    The DAG: a root job; per container, children depending on the root, an inner container
    of 3 children, and a job after the container; a sink after all of those. Beside it, a
    branch that fails for good: its dependents are cancelled and its container dies. Among
    the independent jobs, one in 50 fails its first run and one in 100 fails for good.
    """
    work = Workload()
    done, dead, cancelled = Job.State.DONE, Job.State.DEAD, Job.State.CANCELLED

    def args(n: int, **extra: Any) -> dict[str, Any]:
        return {"n": n, "sleep": round(rnd.uniform(0.002, 0.03), 3), **extra}

    with jobqueue.graph() as g:

        def step(n: int, fail: bool = False, **options: Any) -> Job:
            return g.add("chaos.step", args(n, fail=fail), max_attempts=MAX_ATTEMPTS, **options)

        root = step(0)
        afters = []
        outcomes: list[tuple[Job, str]] = [(root, done)]
        for b in range(boxes):
            box = g.container(f"chaos-box-{b}")
            outcomes.append((box, done))
            outcomes += [(step(i, parent=box, depends_on=[root]), done) for i in range(per_box)]
            inner = g.container(f"chaos-box-{b}-inner", parent=box)
            outcomes.append((inner, done))
            outcomes += [(step(i, parent=inner), done) for i in range(3)]
            afters.append(step(b, depends_on=[box]))
            outcomes.append((afters[-1], done))
        outcomes.append((step(-1, depends_on=afters), done))
        # The branch that fails for good.
        bad = step(1, fail=True)
        below = step(2, depends_on=[bad])
        bad_box = g.container("chaos-bad-box")
        outcomes += [
            (bad, dead),
            (below, cancelled),
            (step(3, depends_on=[below]), cancelled),
            (bad_box, dead),
            (step(4, fail=True, parent=bad_box), dead),
            (step(5, parent=bad_box), done),
            (step(6, depends_on=[bad_box]), cancelled),
        ]
    for job, state in outcomes:
        work.add([job], state)

    specs: list[tuple[dict[str, Any], str]] = []
    for n in range(independent):
        if n % 100 == 99:
            specs.append((args(n, fail=True), dead))
        elif n % 50 == 49:
            specs.append((args(n, flaky=True), done))
        else:
            specs.append((args(n), done))
    for start in range(0, len(specs), 500):
        chunk = specs[start : start + 500]
        jobs = jobqueue.enqueue_many(
            [{"type": "chaos.step", "args": a, "max_attempts": MAX_ATTEMPTS} for a, _ in chunk]
        )
        for job, (spec_args, state) in zip(jobs, chunk, strict=True):
            work.add([job], state)
            if spec_args.get("flaky"):
                work.flaky.add(int(job.pk))
    return work


class Supervisor:
    """Keeps `size` worker processes running; `kill_one()` SIGKILLs one and starts another."""

    def __init__(
        self,
        start_worker: Callable[..., WorkerProcess],
        size: int,
        args: tuple[str, ...],
        env: dict[str, str] | None = None,
    ) -> None:
        self.start_worker = start_worker
        self.args = args
        self.env = env or {}
        self.workers = [self.start() for _ in range(size)]
        self.kills = 0
        self.restarts = 0
        self.killed: list[WorkerProcess] = []

    def kill_one(self, rnd: random.Random) -> None:
        """SIGKILL a random worker (kill -9: no outcome recorded, no lease released)."""
        victim = rnd.choice(self.workers)
        victim.kill()
        self.kills += 1
        self.killed.append(victim)
        self.workers.remove(victim)
        self.workers.append(self.start())
        self.restarts += 1

    def start(self) -> WorkerProcess:
        # SIGABRT makes a worker print every thread's stack (see stop_all).
        return self.start_worker(*self.args, env={"PYTHONFAULTHANDLER": "1", **self.env})

    def assert_healthy(self) -> None:
        """Fail at once if a worker exited unbidden or lost a thread to an exception."""
        for worker in self.workers:
            text = worker.output()
            if not worker.running() or "Exception in thread" in text:
                at = text.find("Exception in thread")
                raise AssertionError(
                    f"worker {worker.pid} (exit {worker.proc.returncode}) is broken:\n"
                    + (text[at : at + 3000] if at >= 0 else text[-3000:])
                )

    def stop_all(self, timeout: float = 60.0) -> list[int]:
        """SIGTERM every worker still supervised; return their exit statuses.

        A worker still running after `timeout` seconds is stuck: it is made to print the stack
        of each thread (SIGABRT with faulthandler on), and the test fails showing them.
        """
        # A worker restarted moments ago may not have installed its signal handlers yet (they
        # come before it registers): SIGTERM would kill it outright, as it would any process.
        for worker in self.workers:
            poll(lambda w=worker: not w.running() or w.row() is not None, timeout=timeout)
        for worker in self.workers:
            if worker.running():
                worker.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for worker in self.workers:
            try:
                worker.proc.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.signal(signal.SIGABRT)
                worker.wait(30)
                raise AssertionError(
                    f"worker {worker.pid} did not stop within {timeout}s of SIGTERM; "
                    f"its threads:\n{worker.output()[-12000:]}"
                ) from None
        return [worker.proc.returncode for worker in self.workers]


# SKIPPED_BEAT (tests/conftest.py): a heartbeat that gave up one lock wait; the suite counts them.


def log_trouble(text: str) -> tuple[list[str], int]:
    """The lines of a worker log that show trouble, and the count of skipped beats."""
    trouble, skipped = [], 0
    for line in text.splitlines():
        if line.startswith(SKIPPED_BEAT):
            skipped += 1
        elif any(marker in line for marker in TROUBLE):
            trouble.append(line)
    return trouble, skipped


def check_log(worker: WorkerProcess, tolerated: tuple[str, ...] = ()) -> int:
    """Fail on trouble in `worker`'s log other than lines starting with `tolerated`; return
    the count of skipped beats."""
    text = worker.output()
    trouble, skipped = log_trouble(text)
    unexpected = [line for line in trouble if not line.startswith(tolerated)]
    if unexpected:
        at = text.index(unexpected[0])
        raise AssertionError(
            f"worker {worker.pid} logged {unexpected[0]!r}:\n{text[max(0, at - 400) : at + 2500]}"
        )
    return skipped


def retrying[T](query: Callable[[], T], timeout: float = 120.0) -> T:
    """Run `query`, reconnecting while the database is unreachable (a server restart)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return query()
        except (OperationalError, InterfaceError):
            connection.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def unfinished(ids: list[int]) -> int:
    """How many of the jobs `ids` are not final yet."""
    return Job.objects.filter(pk__in=ids).exclude(state__in=Job.TERMINAL_STATES).count()


def describe_unfinished(ids: list[int], limit: int = 20) -> str:
    """The rows of jobs `ids` that are not final yet, for a failure message."""
    rows = (
        Job.objects.filter(pk__in=ids)
        .exclude(state__in=Job.TERMINAL_STATES)
        .values_list("pk", "state", "attempts", "lease_owner", "last_error")[:limit]
    )
    return "\n".join(map(str, rows))


@dataclasses.dataclass
class Audit:
    """What a chaos run did to its jobs; `problems` must be empty."""

    jobs: int
    runs: int
    reruns: int
    reclaimed: int
    lost: int
    problems: list[str]


def audit(work: Workload, tolerated: tuple[str, ...] = ()) -> Audit:
    """Check every job of `work` against its expected end and its handler's run records.

    - lost: a job missing, not final, or final in another state than expected;
    - finalized twice: the outcome of a `done` job must come from its last claim (the result
      names that attempt and its process, and that attempt's run record exists, from the same
      process), no run may be recorded for a later attempt than the row's, a container must
      count no open children and end after all its children, and a job must start only after
      its upstream jobs (and every job inside an upstream container) finished;
    - every error is one the workload causes: a lease expiry of a killed worker, the
      designed failures, or one of `tolerated`.
    """
    problems: list[str] = []
    ids = work.ids
    rows = {
        row["id"]: row
        for row in Job.objects.filter(pk__in=ids).values(
            "id",
            "state",
            "attempts",
            "result",
            "errors",
            "last_error",
            "is_container",
            "parent_id",
            "open_children",
            "finished_at",
            "worker_ids",
        )
    }
    runs: dict[int, dict[int, tuple[int, float, float]]] = defaultdict(dict)
    for job_id, attempt, pid, started, finished in RunRecord.objects.filter(
        job_id__in=ids
    ).values_list("job_id", "attempt", "worker_pid", "started", "finished"):
        runs[job_id][attempt] = (pid, started, finished)

    lost = 0
    for pk, expected in work.expected.items():
        row = rows.get(pk)
        if row is None or row["state"] != expected:
            lost += 1
            problems.append(f"job {pk}: expected {expected}, found {row and row['state']}")
    reclaimed = 0
    for pk, row in rows.items():
        for error in row["errors"] or []:
            if error["type"] == LEASE_EXPIRED:
                reclaimed += 1
            elif error["type"] not in (FAIL, FLAKY, *tolerated):
                problems.append(f"job {pk}: unexpected error {error}")
        if row["is_container"]:
            continue
        mine = runs.get(pk, {})
        if any(attempt > row["attempts"] for attempt in mine):
            problems.append(f"job {pk}: a run of an attempt after the row's {row['attempts']}")
        if row["state"] == Job.State.DONE:
            result = row["result"] or {}
            last = mine.get(row["attempts"])
            if (
                result.get("attempt") != row["attempts"]
                or last is None
                or last[0] != result.get("pid")
            ):
                problems.append(
                    f"job {pk}: outcome {result} is not from its last claim "
                    f"(attempts={row['attempts']}, runs={mine})"
                )
        elif (
            row["state"] == Job.State.DEAD
            and (row["last_error"] or {}).get("attempt") != row["attempts"]
        ):
            problems.append(f"job {pk}: dead by {row['last_error']}, not its last claim")
        elif (
            row["state"] == Job.State.CANCELLED
            and (row["last_error"] or {}).get("type") != UPSTREAM_FAILED
        ):
            problems.append(f"job {pk}: cancelled by {row['last_error']}")

    children: dict[int, list[int]] = defaultdict(list)
    for pk, row in rows.items():
        if row["parent_id"] is not None:
            children[row["parent_id"]].append(pk)

    def finish_time(pk: int) -> float | None:
        """When job `pk` (everything inside it, for a container) last finished a run."""
        if rows[pk]["is_container"]:
            times = [finish_time(kid) for kid in children[pk]]
            known = [t for t in times if t is not None]
            return max(known) if known else None
        mine = runs.get(pk)
        return max(f for _, _, f in mine.values()) if mine else None

    for pk, row in rows.items():
        if row["is_container"] and row["state"] in Job.TERMINAL_STATES:
            if row["open_children"] != 0:
                problems.append(f"container {pk}: open_children={row['open_children']}")
            late = [k for k in children[pk] if rows[k]["finished_at"] > row["finished_at"]]
            if late:
                problems.append(f"container {pk} finished before its children {late}")
    for job_id, upstream_id in JobDependency.objects.filter(job_id__in=ids).values_list(
        "job_id", "depends_on_id"
    ):
        mine = runs.get(job_id)
        before = finish_time(upstream_id)
        if mine and (before is None or min(s for _, s, _ in mine.values()) < before):
            problems.append(f"job {job_id} started before its upstream {upstream_id} finished")
        seen = (rows[job_id]["result"] or {}).get("up", {}).get(str(upstream_id))
        upstream = rows[upstream_id]
        if rows[job_id]["state"] == Job.State.DONE and not upstream["is_container"]:
            want = [upstream["result"]["attempt"], upstream["result"]["pid"]]
            if seen != want:
                problems.append(f"job {job_id} saw {seen} of upstream {upstream_id}, not {want}")

    designed = Counter({pk: 2 if pk in work.flaky else 1 for pk in rows if pk in runs})
    total_runs = sum(len(mine) for mine in runs.values())
    return Audit(
        jobs=len(ids),
        runs=total_runs,
        reruns=total_runs - sum(designed.values()),
        reclaimed=reclaimed,
        lost=lost,
        problems=problems,
    )
