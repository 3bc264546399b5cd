"""bench/sustained.py's workload for a peer: a producer at a steady rate for minutes beside
worker processes. Does the peer keep up, and does its table stay bounded?

Run under the peer harness's venv (/tmp/peers-venv), with its services set up
(`../shared/bench-peers/setup_services.sh`):
`/tmp/peers-venv/bin/python bench/peer_sustained.py pgqueuer|procrastinate [--rate 3000]
[--minutes 10] [--workers 2] [--interval 15]`; it prints a JSON line per sample and one with
the figures, shaped as bench/sustained.py's.

The peers, their no-op tasks, their bulk enqueue and their worker commands are the harness's
(`harness/peer_*.py`), with its default worker settings. Each peer keeps its finished jobs as
it does by default: PGQueuer moves them to its log table (`pgqueuer_log`), which nothing
prunes; Procrastinate keeps them in its job table unless its worker deletes them, so it runs
with `--delete-jobs=successful` (the nearest to our `RETENTION`). A sample counts the jobs
drained (enqueued minus those still queued or running), the backlog, and the database's
tables: their total size and dead tuples.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

PEERS = Path(
    os.environ.get("PEERS_DIR", Path(__file__).resolve().parents[2] / "shared/bench-peers")
)
sys.path.insert(0, str(PEERS))

from harness import common  # noqa: E402

CHUNKS_PER_S = 10
# The jobs not yet done (queued or running), in the peer's own tables.
PENDING = {
    "pgqueuer": "SELECT count(*) FROM pgqueuer",
    "procrastinate": "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')",
}
TABLES = (
    "SELECT coalesce(sum(pg_total_relation_size(relid)), 0), coalesce(sum(n_dead_tup), 0), "
    "coalesce(sum(n_live_tup), 0) FROM pg_stat_user_tables"
)


def make_peer(name: str) -> common.Peer:
    if name == "pgqueuer":
        from harness.peer_pgqueuer import PgQueuerPeer

        return PgQueuerPeer()
    os.environ.setdefault("PROCRASTINATE_WORKER_ARGS", "--concurrency=1 --delete-jobs=successful")
    from harness.peer_procrastinate import ProcrastinatePeer

    return ProcrastinatePeer()


def run(name: str, rate: int, minutes: float, workers: int, interval: float) -> dict[str, Any]:
    peer = make_peer(name)
    peer.setup()
    peer.reset()
    mon = peer.mon  # type: ignore[attr-defined]  # every harness peer has its psycopg monitor
    chunk = max(1, rate // CHUNKS_PER_S)
    cmd, env, cwd = peer.worker_cmd()
    procs = common.start_workers(cmd, env, workers, f"sustained-{name}", cwd)
    started = time.perf_counter()
    enqueued, samples = 0, []
    last_t, last_drained = 0.0, 0
    next_chunk, next_sample = started, started + interval
    try:
        while (now := time.perf_counter()) - started < minutes * 60:
            common.check_alive(procs)
            if now >= next_chunk:
                peer.enqueue_bulk(chunk)
                enqueued += chunk
                next_chunk += 1 / CHUNKS_PER_S
            if now >= next_sample:
                pending = mon.execute(PENDING[name]).fetchone()[0]
                size, dead, live = mon.execute(TABLES).fetchone()
                drained = enqueued - pending
                t = now - started
                per_s = (drained - last_drained) / (t - last_t)
                samples.append({
                    "t": round(t),
                    "drained_per_s": round(per_s),
                    "ready": pending,
                    "backlog_s": round(pending / per_s, 1) if per_s > 0 else None,
                    "dead": int(dead),
                    "live": int(live),
                    "mib": round(int(size) / 2**20, 1),
                })  # fmt: skip
                print(json.dumps(samples[-1]), flush=True)
                last_t, last_drained = t, drained
                next_sample += interval
            time.sleep(max(0.0, min(next_chunk, next_sample) - time.perf_counter()))
    finally:
        common.stop_workers(procs)
        peer.teardown()

    def minute_rate(first: bool) -> float:
        end = samples[-1]["t"]
        window = [s for s in samples if (s["t"] <= 60 if first else s["t"] > end - 60)]
        return sum(s["drained_per_s"] for s in window) / max(1, len(window))

    first, last = minute_rate(True), minute_rate(False)
    return {
        "bench": "sustained",
        "queue": name,
        "rate": rate,
        "minutes": minutes,
        "workers": workers,
        "first_minute_per_s": round(first),
        "last_minute_per_s": round(last),
        "last_over_first": round(last / first, 2) if first else None,
        "max_backlog_s": max((s["backlog_s"] or 0) for s in samples) if samples else None,
        "samples": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("peer", choices=sorted(PENDING))
    parser.add_argument("--rate", type=int, default=3000)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--interval", type=float, default=15.0)
    opts = parser.parse_args()
    figures = run(opts.peer, opts.rate, opts.minutes, opts.workers, opts.interval)
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
