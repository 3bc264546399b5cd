"""Print the benchmark figures as ratios against the peers and against the targets.

`python -m bench.report [PEER_RESULT_DIRS...]`: reads our own figures from
.bench-state/results.jsonl (the last of each kind and database) and the peer harness's JSON
files from the given folders (../shared/bench-peers writes one JSON per lane).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .harness import ROOT


def own_figures() -> dict[tuple[str, str, str], dict]:
    """The last figures of each (bench, db, variant) in results.jsonl."""
    found: dict[tuple[str, str, str], dict] = {}
    path = ROOT / ".bench-state" / "results.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            row = json.loads(line)
            variant = str(row.get("workers", row.get("shape", "")))
            found[(row["bench"], row["db"], variant)] = row
    return found


def peer_figures(folders: list[str]) -> dict[str, dict]:
    lanes: dict[str, dict] = {}
    for folder in folders:
        for path in sorted(Path(folder).glob("*.json")):
            if not path.name.startswith("_"):
                data = json.loads(path.read_text())
                if "summary" in data:
                    lanes[path.stem] = data["summary"]
    return lanes


def median(lanes: dict[str, dict], lane: str, key: str) -> float | None:
    cell = lanes.get(lane, {}).get(key) or {}
    return cell.get("median")


def line(what: str, ours: float | None, theirs: float | None, target: str, ok: bool | None) -> str:
    ratio = f"{ours / theirs:.2f}x" if ours and theirs else "n/a"
    mark = "" if ok is None else ("met" if ok else "MISSED")
    fmt = lambda v: "n/a" if v is None else f"{v:,.1f}"  # noqa: E731
    return f"| {what} | {fmt(ours)} | {fmt(theirs)} | {ratio} | {target} | {mark} |"


def main() -> None:
    lanes = peer_figures(sys.argv[1:])
    own = own_figures()
    rows = ["| figure | ours | baseline | ratio | target | |", "|---|---|---|---|---|---|"]
    steady = "drain_2w_steady_jobs_per_s"
    for ours, theirs, factor in (
        ("jobqueue-pg", "pgqueuer-pg", 1.5),
        ("jobqueue-pg", "procrastinate-pg", 10),
        ("jobqueue-mysql", "djtasks-mysql", 5),
        ("jobqueue-sqlite", "djtasks-sqlite", 5),
    ):
        a, b = median(lanes, ours, steady), median(lanes, theirs, steady)
        ok = None if a is None or b is None else a >= factor * b
        rows.append(line(f"steady drain, 2 workers: {ours} / {theirs}", a, b, f">= {factor}x", ok))
    p50 = median(lanes, "jobqueue-pg", "latency_median_ms")
    p95 = median(lanes, "jobqueue-pg", "latency_p95_ms")
    rows.append(line("wake-up p50 ms (PostgreSQL)", p50, None, "<= 5 ms", p50 and p50 <= 5))
    rows.append(line("wake-up p95 ms (PostgreSQL)", p95, None, "<= 15 ms", p95 and p95 <= 15))
    bulk = "enqueue_bulk_jobs_per_s"
    a, b = median(lanes, "jobqueue-pg", bulk), median(lanes, "pgqueuer-pg", bulk)
    rows.append(
        line("bulk enqueue: ours / PGQueuer", a, b, ">= 1x", None if not (a and b) else a >= b)
    )
    for db in ("pg", "mysql", "sqlite"):
        enq = own.get(("enqueue", db, ""))
        if enq:
            ok = enq["enqueue_vs_bare"] >= 0.8
            rows.append(line(f"single enqueue / bare create ({db})", enq["enqueue_per_s"],
                             enq["bare_create_per_s"], ">= 0.8x", ok))  # fmt: skip
        cost = own.get(("claim_cost", db, ""))
        if cost:
            what = f"claim ms, 1M finished + 100k scheduled / empty ({db})"
            ok = cost["ratio"] <= 1.2
            rows.append(line(what, cost["full_ms"], cost["empty_ms"], "<= 1.2x", ok))
        quota = own.get(("limits_claim", db, ""))
        if quota:
            what = f"claim ms, 10,000 tenant:* resources / no limits ({db})"
            ok = quota["ratio"] <= 2
            rows.append(line(what, quota["tenants_ms"], quota["plain_ms"], "<= 2x", ok))
            if "interleaved_ratio" in quota:
                what = f"the same, the two claims taking turns on one table ({db})"
                ok = quota["interleaved_ratio"] <= 2
                ms = (quota["interleaved_tenants_ms"], quota["interleaved_plain_ms"])
                rows.append(line(what, *ms, "<= 2x", ok))
            if "grouped_ratio" in quota:
                what = f"the same, each tenant its own group: 10,000 groups ({db})"
                ok = quota["grouped_ratio"] <= 2
                ms = (quota["grouped_tenants_ms"], quota["grouped_plain_ms"])
                rows.append(line(what, *ms, "<= 2x", ok))
        chains = own.get(("sequences", db, ""))
        if chains:
            what = f"claim ms, 10,000 sequences holding ready jobs / none ({db})"
            ok = chains["ratio"] <= 2
            rows.append(line(what, chains["sequences_ms"], chains["none_ms"], "<= 2x", ok))
        near = own.get(("limits_approach", db, ""))
        if near:
            what = f'starts/s under "10/s" ({db})'
            ok = near["rate_10_per_s_starts"] >= 8
            rows.append(line(what, near["rate_10_per_s_starts"], None, ">= 8", ok))
            what = f"mean in flight under a concurrency of 8 ({db})"
            ok = near["cap_8_mean_in_flight"] >= 7
            rows.append(line(what, near["cap_8_mean_in_flight"], None, ">= 7", ok))
        restart = own.get(("durable_restart", db, ""))
        if restart:
            what = f"s to finish after a crash in piece 19 of 20: steps / plain calls ({db})"
            target = "about 1/20 (pieces 19 and 20 run again: 0.10 at best)"
            rows.append(line(what, restart["steps_s"], restart["plain_s"], target,
                             restart["ratio"] <= 0.15))  # fmt: skip
        step = own.get(("durable_step_cost", db, ""))
        if step:
            what = f"ms of a no-op step / one enqueue() ({db})"
            rows.append(line(what, step["step_ms"], step["enqueue_ms"], "< 2x", step["ratio"] < 2))
        sleeps = own.get(("durable_sleep_drain", db, ""))
        if sleeps:
            what = f"jobs/s, each sleeping once / not ({db})"
            rows.append(line(what, sleeps["sleeping_per_s"], sleeps["plain_per_s"],
                             ">= 0.5x (within 2x)", sleeps["ratio"] >= 0.5))  # fmt: skip
        beside = own.get(("durable_suspended_claim", db, ""))
        if beside:
            what = f"claim ms beside {beside['suspended']:,} suspended jobs / empty table ({db})"
            rows.append(line(what, beside["full_ms"], beside["empty_ms"], "about 1x (<= 1.2x)",
                             beside["ratio"] <= 1.2))  # fmt: skip
        checked = own.get(("replay_check_drain", db, ""))
        if checked:
            what = f"jobs/s of 20-step jobs that replay, position check on / off ({db})"
            rows.append(line(what, checked["checked_per_s"], checked["unchecked_per_s"],
                             "about 1x (>= 0.95x)", checked["ratio"] >= 0.95))  # fmt: skip
        otel = own.get(("otel_drain", db, ""))
        if otel:
            what = f"jobs/s of the no-op drain, OpenTelemetry on (sampling all) / off ({db})"
            rows.append(line(what, otel["on_per_s"], otel["off_per_s"], ">= 0.85x",
                             otel["ratio"] >= 0.85))  # fmt: skip
        steps = own.get(("async_steps", db, ""))
        if steps:
            what = f"async jobs, 3 steps of 0.05 s, jobs/s at concurrency 64 / (64 / 0.15 s) ({db})"
            ideal = steps["concurrency"] / steps["job_seconds"]
            rows.append(line(what, steps["steady_jobs_per_s"], ideal, ">= 0.7x",
                             steps["of_ideal"] >= 0.7))  # fmt: skip
        cpu = own.get(("async_step_cpu", db, ""))
        if cpu and "in_worker_async_vs_sync" in cpu:
            what = f"worker CPU ms of a step at concurrency 64, async / sync handler ({db})"
            rows.append(line(what, cpu["in_worker_async_step_cpu_ms"],
                             cpu["in_worker_sync_step_cpu_ms"], "<= 1.5x",
                             cpu["in_worker_async_vs_sync"] <= 1.5))  # fmt: skip
        if cpu:
            what = f"CPU ms of one step alone, async / sync handler ({db})"
            rows.append(line(what, cpu["async_step_cpu_ms"], cpu["sync_step_cpu_ms"], "<= 1.5x",
                             cpu["async_vs_sync"] <= 1.5))  # fmt: skip
        fan = own.get(("fanout_map", db, ""))
        if fan:
            what = f"s to all done, {fan['jobs']:,} jobs: enqueue_many / one ctx.map() ({db})"
            rows.append(line(what, fan["enqueue_many_s"], fan["map_s"], ">= 0.5x",
                             fan["ratio"] >= 0.5))  # fmt: skip
        budget = own.get(("budgets", db, ""))
        if budget:
            what = f"ms of ctx.acquire() + ctx.settle() / one claim ({db})"
            rows.append(line(what, budget["acquire_settle_ms"], budget["claim_ms"], "<= 1x",
                             budget["ratio"] <= 1))  # fmt: skip
        near = own.get(("budgets_approach", db, ""))
        if near:
            what = f'tokens settled a second / the rate "2000/s", 3 workers ({db})'
            rows.append(line(what, near["fraction"] * 2000, 2000, ">= 0.8x",
                             near["fraction"] >= 0.8))  # fmt: skip
        for shape in ("dag", "container"):
            flow = own.get(("workflows", db, shape))
            base = own.get(("workflows", db, "independent"))
            if flow and base:
                # The DAG has a target; the container is reported beside it.
                what = f"{shape} jobs/s / independent jobs/s ({db})"
                target = ">= 0.67x (within 1.5x)" if shape == "dag" else "reported"
                ok = flow["rate_vs_independent"] >= 1 / 1.5 if shape == "dag" else None
                rows.append(line(what, flow["jobs_per_s"], base["jobs_per_s"], target, ok))
        drain = own.get(("drain", db, "2"))
        if drain and drain.get("peak_rss_mb"):
            rows.append(line(f"worker peak RSS MB, concurrency 8 ({db})", drain["peak_rss_mb"],
                             None, "< 100 MB", drain["peak_rss_mb"] < 100))  # fmt: skip
    print("\n".join(rows))


if __name__ == "__main__":
    main()
