"""OpenTelemetry's cost: the no-op drain with tracing and metrics on, against off, in one run.

`BENCH_DB=pg python -m bench.otel [--jobs 10000] [--rounds 2]`

"On": the jobs are enqueued inside a span (so each carries a traceparent and its attempt is a
child span), and the workers run with ``JOBQUEUE["OPENTELEMETRY"] = True`` and an SDK that
samples every span and exports to nothing (a BatchSpanProcessor in front of an exporter that
drops what it gets; a meter provider whose reader collects every 60 s and drops it too), set
up by bench/project/settings.py from BENCH_OTEL=on. "Off": the same drain without the setting
(the workers import nothing of OpenTelemetry). Two more drains say where the cost lies:
`traces` (``{"METRICS": False}``) and `metrics` (``{"TRACES": False}``). 2 workers at
`--concurrency 8`; the drains alternate, `--rounds` times each (off first), and the best
steady rate of each is compared, since a loaded machine only ever slows a drain down.
`ratio` = on / off jobs/s (the issue's target: at least 0.85, at most 15% slower);
`traces_ratio` and `metrics_ratio` likewise. `*_cpu_us` is the workers' CPU per job of each
drain (the median of its rounds: less at the mercy of a loaded machine than a rate), and
`sdk_floor_us` what the SDK alone takes of this process's CPU per job for what a traced and
measured attempt needs of it (a CONSUMER span with the attempt's eight attributes, made
current, given its outcome and ended, and two histogram records), whatever the queue does.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time

from . import drain as drain_bench
from . import harness

ARGS = ["--concurrency", "8"]


VARIANTS = ("off", "on", "traces", "metrics")


def drain(jobs: int, variant: str) -> tuple[float, float]:
    """Steady jobs/s of `jobs` no-op jobs drained by 2 workers, OpenTelemetry as `variant`,
    and the workers' CPU µs per job."""
    from opentelemetry import trace

    from django_jobqueue import telemetry

    on = variant in ("on", "traces")  # the jobs carry a traceparent
    os.environ["BENCH_OTEL"] = variant  # read by the workers' settings
    telemetry.configure(on)  # this process's enqueue: records the span's traceparent
    span = trace.get_tracer("bench").start_as_current_span("enqueue") if on else None
    try:
        with span or contextlib.nullcontext():
            figures = drain_bench.drain(jobs, 2, ARGS)
    finally:
        os.environ.pop("BENCH_OTEL", None)
        telemetry.configure(False)
    from django_jobqueue.models import Job

    traced = Job.objects.filter(traceparent__isnull=False).exists()
    assert traced == on, f"on={on} but jobs with a traceparent: {traced}"
    rate, cpu = figures["steady_jobs_per_s"], figures["worker_cpu_us_per_job"]
    assert rate is not None and cpu is not None
    return rate, cpu


def sdk_floor(count: int = 20000) -> float:
    """The SDK's CPU µs per job for a traced and measured attempt, in this process."""
    from opentelemetry import context, metrics, trace
    from opentelemetry.trace import SpanKind

    tracer = trace.get_tracer("bench-floor")
    histogram = metrics.get_meter("bench-floor").create_histogram("bench.floor", "s")
    with tracer.start_as_current_span("enqueue"):
        parent = context.get_current()
    point = {"messaging.system": "s", "messaging.destination.name": "q", "jobqueue.job.type": "t"}
    best = float("inf")
    for _ in range(3):
        started = time.process_time()  # every thread's: the span processor's too
        for n in range(count):
            attributes = {**point, "messaging.operation.name": "process",
                          "messaging.operation.type": "process", "messaging.client.id": "w",
                          "messaging.message.id": str(n), "jobqueue.attempt": 1}  # fmt: skip
            span = tracer.start_span("process t", parent, SpanKind.CONSUMER, attributes)
            token = context.attach(trace.set_span_in_context(span))
            context.detach(token)
            span.set_attribute("jobqueue.outcome", "succeeded")
            span.end()
            histogram.record(0.001, point)
            histogram.record(0.002, point)
        best = min(best, (time.process_time() - started) / count * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=2)
    opts = parser.parse_args()
    os.environ["BENCH_OTEL_SDK"] = "1"  # this process's SDK, for the enqueue's span
    harness.setup()
    rates: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    cpu: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    for _ in range(opts.rounds):
        for variant in VARIANTS:
            rate, used = drain(opts.jobs, variant)
            rates[variant].append(rate)
            cpu[variant].append(used)
    best = {variant: max(runs) for variant, runs in rates.items()}
    harness.report(
        "otel_drain",
        {"jobs": opts.jobs, **{f"{v}_per_s": best[v] for v in VARIANTS},
         **{f"{v}_runs": rates[v] for v in VARIANTS}, "ratio": best["on"] / best["off"],
         "traces_ratio": best["traces"] / best["off"],
         "metrics_ratio": best["metrics"] / best["off"],
         **{f"{v}_cpu_us": statistics.median(cpu[v]) for v in VARIANTS},
         "sdk_floor_us": sdk_floor()},
    )  # fmt: skip
    harness.reset()


if __name__ == "__main__":
    main()
