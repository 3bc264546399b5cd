#!/usr/bin/env bash
# `make bench`: our own figures on each database, then the peer harness with our lane beside
# the peers (one run), then ratios. Needs the database services of ../shared/SERVICES.md; the
# peer harness needs root, PyPI and Debian's mirror (see its README). About 70 minutes.
#   BENCH_DBS="pg mysql sqlite"   the databases of our own figures
#   BENCH_SUSTAINED_MINUTES=4     how long each sustained run lasts (the targets ask for 10)
#   PEERS_DIR=../shared/bench-peers   SKIP_PEERS=1 skips the harness
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PEERS_DIR=${PEERS_DIR:-../shared/bench-peers}
mkdir -p .bench-state
rm -f .bench-state/results.jsonl
for db in ${BENCH_DBS:-pg mysql sqlite}; do
    echo "== our figures on $db"
    BENCH_DB=$db "$PY" -m bench.drain --jobs 10000 --workers 1 2
    BENCH_DB=$db "$PY" -m bench.enqueue --jobs 5000
    BENCH_DB=$db "$PY" -m bench.workflows --jobs 10000
    BENCH_DB=$db "$PY" -m bench.claim_cost
    BENCH_DB=$db "$PY" -m bench.limits_claim
    BENCH_DB=$db "$PY" -m bench.sequences
    BENCH_DB=$db "$PY" -m bench.durable
    # The replay's position check: 20-step jobs that suspend and replay, checked / not.
    BENCH_DB=$db "$PY" -m bench.replay_check --jobs 1000 --rounds 2
    # OpenTelemetry's cost: the no-op drain traced and measured (SDK sampling all, exporting
    # nothing) / off, and traces only, metrics only.
    BENCH_DB=$db "$PY" -m bench.otel --jobs 10000 --rounds 2
    BENCH_DB=$db "$PY" -m bench.backlog --sizes 20000 300000
    BENCH_DB=$db "$PY" -m bench.backlog --sizes 150000 --stats fresh stale
    BENCH_DB=$db "$PY" -m bench.sustained --minutes "${BENCH_SUSTAINED_MINUTES:-4}" --interval 15
    BENCH_DB=$db "$PY" -m bench.scale --procs 1 2 4 8
    BENCH_DB=$db "$PY" -m bench.async_io  # beside PGQueuer on pg, with the peers' venv
    # The ORM-bound job (a read, a write, a 50 ms wait), async against sync handlers, at 32 and 128.
    for conc in 32 128; do
        BENCH_DB=$db "$PY" -m bench.async_io --orm --jobs 3000 --seconds 0.05 --concurrency $conc
    done
    # Async durable steps: 10,000 jobs of 3 steps of a 0.05 s asyncio sleep at --concurrency 64
    # (the rate against 64 / 0.15 s), and a step's CPU in an async handler against a sync one.
    BENCH_DB=$db "$PY" -m bench.async_io --steps --jobs 10000 --concurrency 64
    # Budgets: ctx.acquire() plus ctx.settle() against one claim, and how close 3 workers come
    # to a token rate (the units settled a second over the rate).
    BENCH_DB=$db "$PY" -m bench.budgets
    BENCH_DB=$db "$PY" -m bench.budgets --approach
    # Fan-out: one ctx.map() of 20,000 no-op children against enqueue_many() of 20,000 jobs,
    # the time to all done (2 workers at --concurrency 8).
    BENCH_DB=$db "$PY" -m bench.fanout --jobs 20000
    # Server connections against the rate: direct, Django's pool, PgBouncer (PostgreSQL only).
    if [ "$db" = pg ]; then BENCH_DB=pg "$PY" -m bench.connections; fi
done
peer_dirs=()
if [ -z "${SKIP_PEERS:-}" ] && [ -f "$PEERS_DIR/run.sh" ]; then
    # The sustained workload for PGQueuer and Procrastinate (their venv, their services).
    bash "$PEERS_DIR/setup_services.sh" && bash "$PEERS_DIR/setup_venv.sh"
    for peer in pgqueuer procrastinate; do
        PEERS_DIR="$PEERS_DIR" /tmp/peers-venv/bin/python bench/peer_sustained.py "$peer" \
            --minutes "${BENCH_SUSTAINED_MINUTES:-4}" | tee -a .bench-state/peers-sustained.jsonl
    done
    # The runs the engine's targets are judged by (see the harness README): 10,000 jobs, one
    # worker process at --concurrency 8 with the default poll interval, all lanes in one run.
    for lanes in "pgqueuer-pg procrastinate-pg jobqueue-pg" \
                 "djtasks-mysql djtasks-sqlite jobqueue-mysql jobqueue-sqlite"; do
        out="$PWD/.bench-state/peers-${lanes%% *}"
        rm -rf "$out"
        JOBQUEUE_PROJECT=. BENCH_REPS=${BENCH_REPS:-1} BENCH_JOBS=${BENCH_JOBS:-10000} \
            JOBQUEUE_WORKER_ARGS="--concurrency 8" PEERS_ONLY="$lanes" RESULTS_DIR="$out" \
            bash "$PEERS_DIR/run.sh"
        peer_dirs+=("$out")
        cat "$out/summary.md"
    done
else
    echo "== peer harness skipped (SKIP_PEERS set, or no $PEERS_DIR/run.sh)"
fi
echo "== ratios"
"$PY" -m bench.report "${peer_dirs[@]}"
