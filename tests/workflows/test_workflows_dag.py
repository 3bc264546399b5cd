"""Property-based: random DAGs with (nested) containers and failing jobs, run by several worker
processes, end exactly as the graph says, in dependency order; retrying the dead jobs then
brings every job to `done`."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, Phase, event, given, note, settings
from hypothesis import strategies as st

import django_jobqueue as jobqueue
from django_jobqueue.models import Job
from tests.conftest import assert_clean_log, poll
from tests.support.workflow_support import FAST, wipe
from tests.testapp.models import RunRecord

WORKERS = 3
CONCURRENCY = 2


@dataclasses.dataclass
class Node:
    index: int
    box: bool  # a container
    parent: int | None  # index of the enclosing container
    upstream: list[int]  # indexes of the nodes it depends on
    fails: bool  # a job that fails on its first attempt, with one attempt allowed


@dataclasses.dataclass
class Program:
    """What a producer does, in order: open a container block, close the innermost, add a job."""

    ops: list[tuple[str, int]]  # ("open" | "job", node index) or ("close", -1)
    nodes: list[Node]
    use_graph: bool  # write it all with jobqueue.graph() rather than enqueue() and container()

    def children(self, index: int) -> list[Node]:
        return [n for n in self.nodes if n.parent == index]

    def leaves_below(self, index: int) -> list[int]:
        """The jobs (not containers) inside container `index`, at any depth."""
        out: list[int] = []
        for child in self.children(index):
            out += self.leaves_below(child.index) if child.box else [child.index]
        return out

    def expected(self) -> list[str]:
        """Each node's final state: dead if it fails, cancelled below a dead or cancelled
        upstream, a container done when all its children are done and dead otherwise."""
        memo: dict[int, str] = {}

        def state(i: int) -> str:
            if i not in memo:
                node = self.nodes[i]
                if node.box:
                    kids = [state(c.index) for c in self.children(i)]
                    memo[i] = "done" if all(k == "done" for k in kids) else "dead"
                elif any(state(u) != "done" for u in node.upstream):
                    memo[i] = "cancelled"
                else:
                    memo[i] = "dead" if node.fails else "done"
            return memo[i]

        return [state(n.index) for n in self.nodes]


@st.composite
def programs(draw: st.DrawFn) -> Program:
    nodes: list[Node] = []
    ops: list[tuple[str, int]] = []
    stack: list[int] = []  # the open containers, innermost last
    for _ in range(draw(st.integers(min_value=4, max_value=18))):
        action = draw(st.sampled_from(["job", "job", "job", "open", "close"]))
        parent = stack[-1] if stack else None
        if action == "close" and stack:
            stack.pop()
            ops.append(("close", -1))
        elif action == "open" and len(stack) < 3:
            nodes.append(Node(len(nodes), True, parent, [], False))
            stack.append(len(nodes) - 1)
            ops.append(("open", len(nodes) - 1))
        else:
            # Any earlier node but an open container enclosing this job: a child cannot wait
            # for its own container (that is rejected as a cycle).
            candidates = [n.index for n in nodes if n.index not in stack]
            upstream = (
                draw(st.lists(st.sampled_from(candidates), max_size=3, unique=True))
                if candidates
                else []
            )
            fails = draw(st.integers(min_value=0, max_value=3)) == 0
            nodes.append(Node(len(nodes), False, parent, upstream, fails))
            ops.append(("job", len(nodes) - 1))
    ops += [("close", -1)] * len(stack)
    return Program(ops, nodes, draw(st.booleans()))


def build(program: Program) -> list[Job]:
    """Write the program's jobs (while the workers already run them, with enqueue())."""
    made: list[Job | None] = [None] * len(program.nodes)

    def ref(i: int | None) -> Job | None:
        return None if i is None else made[i]

    def args(node: Node) -> dict[str, int]:
        return {"fail_until": 1} if node.fails else {}

    if program.use_graph:
        with jobqueue.graph() as g:
            for op, i in program.ops:
                node = program.nodes[i] if i >= 0 else None
                if op == "open" and node is not None:
                    made[i] = g.container(f"box {i}", parent=ref(node.parent))
                elif op == "job" and node is not None:
                    made[i] = g.add(
                        "wf.step",
                        args(node),
                        depends_on=[made[u] for u in node.upstream],  # type: ignore[misc]
                        parent=ref(node.parent),
                        max_attempts=1,
                    )
    else:
        blocks: list[Iterator[Job]] = []
        for op, i in program.ops:
            node = program.nodes[i] if i >= 0 else None
            if op == "open" and node is not None:
                block = jobqueue.container(f"box {i}", parent=ref(node.parent))
                made[i] = block.__enter__()
                blocks.append(block)  # type: ignore[arg-type]
            elif op == "close":
                blocks.pop().__exit__(None, None, None)  # type: ignore[attr-defined]
            elif node is not None:
                made[i] = jobqueue.enqueue(
                    "wf.step",
                    args(node),
                    depends_on=[made[u] for u in node.upstream],  # type: ignore[misc]
                    parent=ref(node.parent),
                    max_attempts=1,
                )
    assert all(job is not None and job.pk for job in made)
    return made  # type: ignore[return-value]


def settle(ids: list[int]) -> dict[int, Job]:
    """Wait until every job is final; return them by id."""

    def all_final() -> bool:
        return not Job.objects.filter(pk__in=ids).exclude(state__in=Job.TERMINAL_STATES).exists()

    try:
        poll(all_final, timeout=90, interval=0.05)
    except AssertionError:
        rows = list(Job.objects.filter(pk__in=ids).values_list("pk", "state", "parent_id"))
        raise AssertionError(f"jobs not final after 90s: {rows}") from None
    return Job.objects.in_bulk(ids)


def check_order_and_results(program: Program, jobs: list[Job], rows: dict[int, Job]) -> None:
    """Every run started after every run of everything upstream had finished (handler clock,
    and the database clock for started_at/finished_at); every container finished after its
    children; each done job saw exactly its upstream jobs' results."""
    runs: dict[int, list[tuple[float, float]]] = {}
    for job_id, started, finished in RunRecord.objects.values_list("job_id", "started", "finished"):
        runs.setdefault(job_id, []).append((started, finished))
    for node, job in zip(program.nodes, jobs, strict=True):
        row = rows[job.pk]
        if node.box:
            assert row.attempts == 0 and row.started_at is None and job.pk not in runs
            for child in program.children(node.index):
                assert row.finished_at >= rows[jobs[child.index].pk].finished_at, (node, child)
            continue
        if row.state == "cancelled":
            assert job.pk not in runs and row.started_at is None
            continue
        assert len(runs[job.pk]) == row.attempts
        first_start = min(start for start, _ in runs[job.pk])
        for u in node.upstream:
            up = rows[jobs[u].pk]
            assert up.state == "done", (node, u)
            assert row.started_at >= up.finished_at, (node, u)
            before = program.leaves_below(u) if program.nodes[u].box else [u]
            for leaf in before:
                last_end = max(end for _, end in runs[jobs[leaf].pk])
                assert first_start >= last_end, (node, u, leaf)
        if row.state == "done":
            seen = {str(jobs[u].pk): None if program.nodes[u].box else jobs[u].pk
                    for u in node.upstream}  # fmt: skip
            assert row.result == {"me": job.pk, "up": seen}, node


def check_causes(program: Program, jobs: list[Job], rows: dict[int, Job]) -> None:
    """A cancelled job names, as cancelled_by and in last_error, a dead job upstream of it."""
    index_of = {job.pk: i for i, job in enumerate(jobs)}

    def above(i: int) -> set[int]:
        found: set[int] = set()
        todo = list(program.nodes[i].upstream)
        while todo:
            u = todo.pop()
            if u not in found:
                found.add(u)
                todo += program.nodes[u].upstream
        return found

    for i, job in enumerate(jobs):
        row = rows[job.pk]
        if row.state != "cancelled":
            continue
        cause = row.cancelled_by_id
        assert cause in index_of and index_of[cause] in above(i), (i, cause)
        assert rows[cause].state == "dead"
        assert row.last_error["message"] == f"upstream job {cause} ended dead"


@pytest.fixture
def fleet(start_worker):
    """Worker processes shared by all examples of one test (starting them costs seconds)."""
    workers = [start_worker("--concurrency", str(CONCURRENCY), *FAST) for _ in range(WORKERS)]
    for worker in workers:
        worker.wait_registered()
    yield workers
    for worker in workers:
        assert worker.stop() == 0, worker.output()
        assert_clean_log(worker.output())


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@settings(
    # Raise it for a stress run:
    # JOBQUEUE_TEST_DAG_EXAMPLES=200 pytest tests/workflows/test_workflows_dag.py
    max_examples=int(os.environ.get("JOBQUEUE_TEST_DAG_EXAMPLES", "8")),
    deadline=None,
    database=None,
    # No shrinking: each example runs real worker processes for seconds; the failing example
    # is printed as drawn.
    phases=[Phase.explicit, Phase.generate],
    # The worker processes are meant to outlive single examples; each example wipes the tables.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(program=programs())
def test_random_workflows_end_as_the_graph_says_and_retry_completes_them(fleet, program):
    wipe()
    note(f"program: {program}")
    expected = program.expected()
    event(f"written with {'graph()' if program.use_graph else 'enqueue() and container()'}")
    event(f"containers: {sum(n.box for n in program.nodes)}")
    event(f"nested containers: {any(n.box and n.parent is not None for n in program.nodes)}")
    event(f"final states: {sorted(set(expected))}")
    jobs = build(program)
    ids = [job.pk for job in jobs]
    rows = settle(ids)
    assert Job.objects.count() == len(program.nodes)  # none lost, none extra
    assert [rows[pk].state for pk in ids] == expected
    check_order_and_results(program, jobs, rows)
    check_causes(program, jobs, rows)

    # Retry every dead job (each succeeds on its second attempt); the jobs they revive may
    # fail on their own first attempt, so go round until nothing is dead.
    for rounds in range(len(program.nodes) + 1):
        dead = [pk for pk in ids if rows[pk].state == "dead" and not rows[pk].is_container]
        if not dead:
            event(f"retry rounds: {rounds}")
            break
        for pk in dead:
            retried = jobqueue.retry(pk, extra_attempts=1)
            assert retried.max_attempts == retried.attempts + 1
        rows = settle(ids)
    assert {rows[pk].state for pk in ids} == {"done"}
    assert Job.objects.count() == len(program.nodes)
    check_order_and_results(program, jobs, rows)
    assert {w.pid for w in fleet} >= set(RunRecord.objects.values_list("worker_pid", flat=True))
