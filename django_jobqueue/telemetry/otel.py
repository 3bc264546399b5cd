"""Every OpenTelemetry call of the package: the spans of attempts and steps, and the metrics.

Imported only when ``JOBQUEUE["OPENTELEMETRY"]`` is on (see the package's `configure`). It
reports through the application's providers (`trace.get_tracer`, `metrics.get_meter`), so
whatever SDK, sampler and exporters the application set up receive it; with none set up,
the API's no-op providers drop everything.

Traces. `enqueue()` (and every path that builds jobs) stores the current span's W3C
`traceparent` on the job. Each attempt is a CONSUMER span "process <handler key>" whose
parent is that creation context: the messaging conventions allow it for a process span that
handles a single message (links are their default, for batches), and as a child a workflow
(a request, its job, the job's steps and the children it spawned) is one trace. The worker
runs attempts in no ambient span, so there is no other context to link. The span is current
while the handler runs (in its thread, or its asyncio task), so durable steps are its child
spans, the jobs it spawns carry its context, and log records carry its ids. A suspension
(sleep, wait) and a `RateLimited` are events on it.

Metrics. The job counters are asynchronous (observable) counters over the process's own
tallies, counted where the package records an outcome (`outcomes`, the reclaimer), where a
job starts and where its enqueue commits (the `job_enqueued` signal); the two histograms
record each attempt; the queue and limit gauges come from a worker duty (`worker/gauges.py`)
that reads the database at most every GAUGE_INTERVAL seconds, in one worker only. The units
of a resource that TOKEN_RESOURCES says counts tokens carry the GenAI conventions'
`gen_ai.token.type`, and the units an attempt settled of such resources are its span's
`gen_ai.usage.input_tokens` and `gen_ai.usage.output_tokens`.
"""

from __future__ import annotations

import datetime as dt
import functools
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from django.dispatch import Signal
from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .. import signals
from ..exceptions import RateLimited, Suspend
from ..limits.spec import find

if TYPE_CHECKING:
    # What `begin` returns and `end` takes: the attempt's span and its context's token.
    from contextvars import Token

    from ..engine.attempts import InFlight, Outcome
    from ..lease_results import ClaimedJob

    Begun = tuple[trace.Span, Token[otel_context.Context]]

SYSTEM = "django_jobqueue"  # messaging.system
SCOPE = "django_jobqueue"  # the instrumentation scope of the tracer and the meter
# Seconds: the buckets the messaging conventions advise for messaging.process.duration,
# and for the wait from ready to start, longer ones too (a queue may wait minutes).
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10)
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 15, 60, 300, 1800, 3600)

# Attribute names: the messaging conventions' where they define one, the queue's own otherwise.
DESTINATION = "messaging.destination.name"  # the queue
HANDLER = "jobqueue.job.type"  # the handler key
STATE = "jobqueue.job.state"
RESOURCE = "jobqueue.limit.resource"
# The GenAI semantic conventions': the type of token a resource counts ("input", "output"),
# and an attempt span's sums of each (gen_ai.usage.input_tokens, gen_ai.usage.output_tokens).
TOKEN_TYPE = "gen_ai.token.type"
USAGE = "gen_ai.usage.{}_tokens"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("django-jobqueue")
    except PackageNotFoundError:  # pragma: no cover - a checkout that was never installed
        return "0"


class OpenTelemetry:
    """The tracer, the instruments and the signal receivers of one configuration."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.traces = bool(options["TRACES"])
        self.recording_metrics = bool(options["METRICS"])
        self.gauge_interval = float(options["GAUGE_INTERVAL"])
        # {resource or pattern: "input" or "output"}: the resources that count tokens
        self.token_resources: dict[str, str] = dict(options["TOKEN_RESOURCES"])
        self._propagator = TraceContextTextMapPropagator()
        self._last_parent: tuple[str | None, otel_context.Context] = (None, otel_context.Context())
        version = _version()
        self.tracer = trace.get_tracer(SCOPE, version)
        self._lock = threading.Lock()
        # {queue: (ready jobs, oldest ready job's age)}, written by the gauge duty; None: this
        # process does not report the queue gauges.
        self.queues: dict[str, tuple[int, float]] | None = None
        # {resource: (units held by the jobs in flight, its concurrency or None)}, likewise.
        self.limits: dict[str, tuple[int, int | None]] | None = None
        self._leases: dict[str, Callable[[], int]] = {}  # worker id -> its leases in flight
        self._receivers: list[tuple[Signal, Callable[..., None]]] = []
        if self.recording_metrics:
            self._instruments(metrics.get_meter(SCOPE, version))

    def _instruments(self, meter: metrics.Meter) -> None:
        count = "{job}"
        # The job counters are observed from this process's own tallies (`_count`): a
        # synchronous counter's add() costs the worker more than the rest of a no-op job.
        for name, description in (
            ("enqueued", "Jobs enqueued"),
            ("started", "Attempts started"),
            ("finished", "Attempts that returned and were recorded (state: done, cancelled)"),
            ("failed", "Attempts that failed (state: what became of the job)"),
            ("dead", "Jobs that failed for good"),
        ):
            observe = functools.partial(_observe_counter, name)
            meter.create_observable_counter(f"jobqueue.jobs.{name}", [observe], count, description)
        self.duration = meter.create_histogram(
            "messaging.process.duration",
            "s",
            "Seconds the handler ran, per attempt",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.wait = meter.create_histogram(
            "jobqueue.job.wait",
            "s",
            "Seconds from ready (enqueued, or due) to the start of a job's first attempt",
            explicit_bucket_boundaries_advisory=WAIT_BUCKETS,
        )
        self.granted = meter.create_counter(
            "jobqueue.limit.units.granted", "{unit}", "Units of a rated resource granted"
        )
        self.settled = meter.create_counter(
            "jobqueue.limit.units.settled", "{unit}", "Units of a rated resource settled as used"
        )
        ready = functools.partial(_observe, "_observe_ready")
        meter.create_observable_gauge("jobqueue.queue.ready", [ready], count, "Ready jobs by queue")
        meter.create_observable_gauge(
            "jobqueue.queue.oldest_ready_age",
            [functools.partial(_observe, "_observe_oldest")],
            "s",
            "Seconds the oldest ready job of each queue has waited",
        )
        meter.create_observable_gauge(
            "jobqueue.limit.occupancy",
            [functools.partial(_observe, "_observe_occupancy")],
            "{unit}",
            "Units of each resource the jobs in flight hold",
        )
        meter.create_observable_gauge(
            "jobqueue.limit.capacity",
            [functools.partial(_observe, "_observe_capacity")],
            "{unit}",
            "The concurrency limit in force of each resource that has one",
        )
        meter.create_observable_gauge(
            "jobqueue.leases.in_flight",
            [functools.partial(_observe, "_observe_leases")],
            count,
            "Attempts a worker holds a lease on",
        )
        # Sent where jobs are enqueued: not the worker's hot path.
        for signal, receiver in ((signals.job_enqueued, self._on_enqueued),):
            signal.connect(receiver, weak=False, dispatch_uid=f"jobqueue-otel-{id(self)}")
            self._receivers.append((signal, receiver))

    def close(self) -> None:
        """Disconnect the signal receivers (the instruments stay with the meter provider)."""
        for signal, _ in self._receivers:
            signal.disconnect(dispatch_uid=f"jobqueue-otel-{id(self)}")
        self._receivers.clear()

    # -- traces --------------------------------------------------------------------------------

    def traceparent(self) -> str | None:
        """The current span's W3C traceparent, stored on a job as it is built (None: none)."""
        if not self.traces or not trace.get_current_span().get_span_context().is_valid:
            return None
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier)
        return carrier.get("traceparent")

    def begin(self, flight: InFlight) -> Begun | None:
        """Open an attempt's span and make it current in this thread or asyncio task (until
        `end`); count the start. None: traces are off.

        Two plain calls rather than a context manager: this runs once per job on the worker's
        hot path, where a generator-based context manager costs as much as our own work.
        """
        job = flight.job
        if self.recording_metrics:
            self._count("started", job.type, job.queue)
            self._record_wait(job)
        if not self.traces:
            return None
        # The shared part (never changed) and the attempt's own, in a new dict for the span.
        attributes: dict[str, str | int] = {
            **_static_span_attributes(job.type, job.queue, flight.lease.owner),
            "messaging.message.id": str(job.id),
            "jobqueue.attempt": flight.lease.attempt,
        }
        span = self.tracer.start_span(
            f"process {job.type}",
            context=self._parent(job.traceparent),
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        )
        return span, otel_context.attach(trace.set_span_in_context(span))

    def end(self, begun: Begun | None) -> None:
        """Detach and end the span `begin` opened (nothing when traces are off)."""
        if begun is not None:
            span, token = begun
            otel_context.detach(token)
            span.end()

    def _parent(self, traceparent: str | None) -> otel_context.Context:
        """The context an attempt's span is the child of: its job's creation context, or
        none (a root span, not a child of whatever runs the worker)."""
        if not traceparent:
            return otel_context.Context()
        last = self._last_parent  # the jobs of one enqueue_many() share theirs
        if last[0] == traceparent:
            return last[1]
        parent = self._propagator.extract({"traceparent": traceparent})
        self._last_parent = (traceparent, parent)
        return parent

    def ended(self, begun: Begun | None, flight: InFlight, outcome: Outcome | None) -> None:
        """Say on the attempt's span how it ended: its outcome, error, suspension or 429."""
        if begun is None:
            return
        span = begun[0]
        if not span.is_recording():  # sampled out: the SDK would drop all of it
            return
        context = flight.context
        if context is not None:  # the tokens it settled, from the handler's thread: done now
            for kind, units in context._token_usage.items():
                span.set_attribute(USAGE.format(kind), units)
        if outcome is None:  # settled elsewhere: timed out, or handed back at shutdown
            span.set_attribute("jobqueue.outcome", "timed_out" if flight.abandoned else "released")
            if flight.abandoned:
                span.set_status(Status(StatusCode.ERROR, "timed out"))
            return
        error = outcome.error
        if error is None:
            span.set_attribute("jobqueue.outcome", "succeeded")
        elif isinstance(error, Suspend):
            span.set_attribute("jobqueue.outcome", "suspended")
            span.add_event(*_suspension(error))
        elif isinstance(error, RateLimited):
            span.set_attribute("jobqueue.outcome", "rate_limited")
            span.add_event(
                "jobqueue.rate_limited",
                {RESOURCE: error.resource, "jobqueue.retry_after": float(error.retry_after)},
            )
        else:
            span.set_attribute("jobqueue.outcome", "failed")
            span.set_attribute("error.type", _qualname(error))
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{_qualname(error)}: {error}"))

    @contextmanager
    def step(self, name: str, seq: int) -> Iterator[None]:
        """A durable step's span, child of its attempt's (current in the step's thread)."""
        if not self.traces:
            yield
            return
        attributes: dict[str, str | int] = {"jobqueue.step.name": name, "jobqueue.step.seq": seq}
        with self.tracer.start_as_current_span(f"step {name}", attributes=attributes):
            yield

    # -- metrics -------------------------------------------------------------------------------

    def _record_wait(self, job: ClaimedJob) -> None:
        # A first attempt only, as the admin's latency chart (metrics.Tally): a retry's or a
        # resumed durable job's wait is not the queue's.
        if job.attempts != 1 or job.has_steps:
            return
        if job.created_at is None:
            return
        since = job.created_at
        if job.run_after is not None and job.run_after > since:
            since = job.run_after
        waited = (dt.datetime.now(dt.UTC) - since).total_seconds()
        self.wait.record(max(0.0, waited), _attributes(job.type, job.queue))

    def token_type(self, resource: str) -> str | None:
        """The type of token `resource` counts ("input", "output"), or None."""
        found = find(resource, self.token_resources) if self.token_resources else None
        return None if found is None else found[1]

    def _unit_attributes(self, resource: str, kind: str | None) -> dict[str, str]:
        if kind is None:
            return {RESOURCE: resource}
        return {RESOURCE: resource, TOKEN_TYPE: kind}

    def units_granted(self, resource: str, units: int) -> None:
        if self.recording_metrics:
            self.granted.add(units, self._unit_attributes(resource, self.token_type(resource)))

    def units_settled(self, resource: str, used: int, usage: dict[str, int]) -> None:
        """Count units settled as used; of a resource that counts tokens, add them to `usage`
        too (the run's tokens by type, which `ended` sets on its attempt span)."""
        kind = self.token_type(resource)
        if self.recording_metrics:
            self.settled.add(used, self._unit_attributes(resource, kind))
        if kind is not None:
            usage[kind] = usage.get(kind, 0) + used

    def _count(self, name: str, job_type: str, queue: str, state: str | None = None) -> None:
        key = (name, job_type, queue, state)
        with _lock:
            _counts[key] = _counts.get(key, 0) + 1

    def recorded(self, outcome: Outcome, state: str | None) -> None:
        """Count an outcome the worker recorded (None: its lease was lost), and time it."""
        if not self.recording_metrics or state is None:
            return
        job = outcome.flight.job
        error = outcome.error
        if error is None:
            self._count("finished", job.type, job.queue, state)
            self.duration.record(outcome.duration, _attributes(job.type, job.queue))
            return
        self.failed(job.type, job.queue, state, _qualname(error))
        attributes = {**_attributes(job.type, job.queue), "error.type": _qualname(error)}
        self.duration.record(outcome.duration, attributes)

    def failed(self, job_type: str, queue: str, state: str, error_type: str) -> None:
        """Count a failed attempt (and a dead job): recorded, or reclaimed from a dead worker."""
        if self.recording_metrics:
            self._count("failed", job_type, queue, state)
            if state == "dead":
                self._count("dead", job_type, queue)

    def _on_enqueued(self, sender: Any, *, job_type: str, queue: str, **kwargs: Any) -> None:
        self._count("enqueued", job_type, queue)

    def watch_leases(self, worker_id: str, count: Callable[[], int] | None) -> None:
        """Report the leases `count()` says worker `worker_id` holds (None: stop)."""
        with self._lock:
            if count is None:
                self._leases.pop(worker_id, None)
            else:
                self._leases[worker_id] = count

    def _observe_leases(self) -> Iterable[metrics.Observation]:
        with self._lock:
            watched = list(self._leases.items())
        return [metrics.Observation(count(), {"messaging.client.id": w}) for w, count in watched]

    def _observe_ready(self) -> Iterable[metrics.Observation]:
        queues = self.queues or {}
        return [metrics.Observation(n, {DESTINATION: q}) for q, (n, _) in queues.items()]

    def _observe_oldest(self) -> Iterable[metrics.Observation]:
        queues = self.queues or {}
        return [metrics.Observation(age, {DESTINATION: q}) for q, (_, age) in queues.items()]

    def _observe_occupancy(self) -> Iterable[metrics.Observation]:
        held = self.limits or {}
        return [
            metrics.Observation(units, self._unit_attributes(r, self.token_type(r)))
            for r, (units, _) in held.items()
        ]

    def _observe_capacity(self) -> Iterable[metrics.Observation]:
        held = self.limits or {}
        return [
            metrics.Observation(cap, self._unit_attributes(r, self.token_type(r)))
            for r, (_, cap) in held.items()
            if cap is not None
        ]


# (counter, handler key, queue, state) -> count since the process started: the observable job
# counters' values, kept across configurations (a meter provider keeps an instrument's first
# callbacks, and its cumulative sums, for good).
_counts: dict[tuple[str, str, str, str | None], int] = {}
_lock = threading.Lock()


def _observe_counter(name: str, options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
    with _lock:
        counts = [(k, n) for k, n in _counts.items() if k[0] == name]
    return [
        metrics.Observation(n, _attributes(job_type, queue, state))
        for (_, job_type, queue, state), n in counts
    ]


def _observe(method: str, options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
    """A gauge's observations, from the configuration on now (none when it is off)."""
    from . import active

    return [] if active is None else getattr(active, method)()


@functools.lru_cache(maxsize=1024)  # bounded: queue names are the users' to invent
def _static_span_attributes(job_type: str, queue: str, owner: str) -> dict[str, str]:
    """The attributes an attempt span shares with every attempt of `job_type` on `queue` run
    by worker `owner` (never changed: `begin` copies them)."""
    return {
        "messaging.system": SYSTEM,
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
        DESTINATION: queue,
        "messaging.client.id": owner,
        HANDLER: job_type,
    }


@functools.lru_cache(maxsize=1024)  # bounded, as above
def _attributes(job_type: str, queue: str, state: str | None = None) -> dict[str, str]:
    """A metric point's attributes (one dict per combination: they are never changed)."""
    attributes = {"messaging.system": SYSTEM, DESTINATION: queue, HANDLER: job_type}
    if state is not None:
        attributes[STATE] = state
    return attributes


def _qualname(error: BaseException) -> str:
    cls = type(error)
    return f"{cls.__module__}.{cls.__qualname__}"


def _suspension(error: Suspend) -> tuple[str, dict[str, Any]]:
    """The span event of a suspension: a sleep, or a wait (for an event, jobs, a map)."""
    if error.kind == "sleep":
        attributes: dict[str, Any] = {}
        if error.delay is not None:
            attributes["jobqueue.sleep.seconds"] = float(error.delay)
        if error.until is not None:
            attributes["jobqueue.sleep.until"] = error.until.isoformat()
        return "jobqueue.sleep", attributes
    attributes = {"jobqueue.wait.kind": error.kind}
    if error.key is not None:
        attributes["jobqueue.wait.event"] = error.key
    if error.job_ids:
        attributes["jobqueue.wait.jobs"] = len(error.job_ids)
    if error.until is not None:
        attributes["jobqueue.wait.until"] = error.until.isoformat()
    return "jobqueue.wait", attributes
