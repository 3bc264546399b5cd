"""OpenTelemetry (JOBQUEUE["OPENTELEMETRY"]), in the test process: the trace context a job
takes from its enqueuer, the spans of attempts and steps (real SDK, in-memory exporter), the
metrics, the settings' checks. Worker processes: test_telemetry_workers.py; the setting off,
or opentelemetry-api absent: test_telemetry_off.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.checks import run_checks

import django_jobqueue as jobqueue
from django_jobqueue import conf, telemetry
from django_jobqueue.models import Job
from django_jobqueue.testing import run_jobs

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

from tests.support.otel_support import collect, in_memory

pytestmark = pytest.mark.django_db


@pytest.fixture
def otel(settings: Any) -> Any:
    """Tracing and metrics on, with the SDK's in-memory exporter and reader."""
    spans, reader = in_memory()
    spans.clear()
    reader.get_metrics_data()  # deltas: what the test does is what the next collection holds
    settings.JOBQUEUE = {**settings.JOBQUEUE, "OPENTELEMETRY": True}
    assert telemetry.active is not None
    yield spans, reader
    spans.clear()


def ran(otel: Any, key: str, *, ignore_delays: bool = True) -> dict[str, list[Any]]:
    """Enqueue a job of handler `key`, run what is runnable: {name: finished spans}."""
    spans, _ = otel
    jobqueue.enqueue(key)
    run_jobs(ignore_delays=ignore_delays)
    by_name: dict[str, list[Any]] = {}
    for span in spans.get_finished_spans():
        by_name.setdefault(span.name, []).append(span)
    return by_name


def test_the_hook_is_off_by_default_and_follows_the_setting(settings):
    assert telemetry.active is None
    settings.JOBQUEUE = {**settings.JOBQUEUE, "OPENTELEMETRY": {"METRICS": False}}
    assert telemetry.active is not None and not telemetry.active.recording_metrics
    settings.JOBQUEUE = {**settings.JOBQUEUE, "OPENTELEMETRY": False}
    assert telemetry.active is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("yes", "must be True, False or a dict"),
        ({"TRACE": True}, "unknown option 'TRACE'"),
        ({"GAUGE_INTERVAL": 0}, "GAUGE_INTERVAL'] must be a positive number"),
        ({"METRICS": 1}, "['METRICS'] must be True or False"),
    ],
)
def test_bad_opentelemetry_settings_are_reported(value, message):
    found, usable = conf.examine({"OPENTELEMETRY": value})
    assert any(message in p.message for p in found), found
    assert isinstance(usable.opentelemetry, bool | dict)


def test_a_job_enqueued_in_a_span_runs_as_its_child(otel):
    spans, _ = otel
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("request") as request:
        job = jobqueue.enqueue("test.add", {"a": 1, "b": 2}, queue="reports")
    assert Job.objects.get(pk=job.pk).traceparent == job.traceparent
    assert job.traceparent.split("-")[1] == format(request.get_span_context().trace_id, "032x")
    run_jobs()
    (span,) = [s for s in spans.get_finished_spans() if s.name == "process test.add"]
    assert span.kind == SpanKind.CONSUMER
    assert span.parent.span_id == request.get_span_context().span_id
    assert span.context.trace_id == request.get_span_context().trace_id
    assert not span.links  # a child of its creation context: no link to it besides
    assert span.attributes["messaging.system"] == "django_jobqueue"
    assert span.attributes["messaging.operation.name"] == "process"
    assert span.attributes["messaging.destination.name"] == "reports"
    assert span.attributes["messaging.message.id"] == str(job.pk)
    assert span.attributes["jobqueue.job.type"] == "test.add"
    assert span.attributes["jobqueue.attempt"] == 1
    assert span.attributes["jobqueue.outcome"] == "succeeded"
    assert span.attributes["messaging.client.id"]


def test_a_job_enqueued_outside_any_span_gets_a_root_span(otel):
    spans, _ = otel
    job = jobqueue.enqueue("test.noop")
    assert job.traceparent is None
    run_jobs()
    (span,) = [s for s in spans.get_finished_spans() if s.name == "process test.noop"]
    assert span.parent is None and not span.links


def test_every_way_of_enqueuing_records_the_trace_context(otel):
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("batch"):
        many = jobqueue.enqueue_many([("test.noop", {}), ("test.add", {"a": 1, "b": 1})])
        mixed = jobqueue.enqueue_many([{"type": "test.noop", "priority": 3}])
        with jobqueue.graph() as g:
            node = g.add("test.noop")
    ids = [j.pk for j in [*many, *mixed]] + [node.job.pk if hasattr(node, "job") else node.pk]
    rows = Job.objects.filter(pk__in=ids)
    assert rows.count() == 4
    assert all(row.traceparent for row in rows)


def test_an_error_is_recorded_on_its_span_with_the_status(otel):
    (span,) = ran(otel, "otel.broken")["process otel.broken"][-1:]
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes["jobqueue.outcome"] == "failed"
    assert span.attributes["error.type"] == "builtins.ValueError"
    (event,) = span.events
    assert event.name == "exception"
    assert event.attributes["exception.message"] == "bad row"


def test_steps_are_child_spans_and_a_sleep_an_event(otel):
    spans = ran(otel, "otel.pipeline", ignore_delays=False)  # the first run suspends
    (attempt,) = spans["process otel.pipeline"]
    (fetch,) = spans["step fetch"]
    assert fetch.parent.span_id == attempt.context.span_id
    assert fetch.attributes["jobqueue.step.name"] == "fetch"
    assert attempt.attributes["jobqueue.outcome"] == "suspended"
    assert [e.name for e in attempt.events] == ["jobqueue.sleep"]
    assert attempt.events[0].attributes["jobqueue.sleep.seconds"] == 0.2


def test_a_spawned_child_continues_the_parents_trace(otel):
    spans = ran(otel, "otel.pipeline")
    (parent,) = spans["process otel.pipeline"]
    (child,) = spans["process otel.child"]
    assert child.parent.span_id == parent.context.span_id
    assert child.context.trace_id == parent.context.trace_id
    for step in (*spans["step fetch"], *spans["step store"]):
        assert step.parent.span_id == parent.context.span_id


def test_async_steps_are_child_spans_of_their_attempt(otel):
    spans = ran(otel, "otel.async_steps")
    (attempt,) = spans["process otel.async_steps"]
    steps = [*spans["step one"], *spans["step two"]]
    assert len(steps) == 2
    assert all(s.parent.span_id == attempt.context.span_id for s in steps)


def test_rate_limited_is_an_event_on_the_attempt(otel, settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "LIMITS": {"otel-api": {"concurrency": 5}}}
    (span,) = ran(otel, "otel.limited", ignore_delays=False)["process otel.limited"]
    assert span.attributes["jobqueue.outcome"] == "rate_limited"
    (event,) = span.events
    assert event.name == "jobqueue.rate_limited"
    assert event.attributes["jobqueue.limit.resource"] == "otel-api"
    assert span.status.status_code == StatusCode.UNSET


def key(job_type: str, queue: str = "default", state: str | None = None) -> tuple[Any, ...]:
    """The attributes of a job counter's point, as `collect` keys them."""
    attributes = {"jobqueue.job.type": job_type, "messaging.destination.name": queue}
    attributes["messaging.system"] = "django_jobqueue"
    if state is not None:
        attributes["jobqueue.job.state"] = state
    return tuple(sorted(attributes.items()))


def test_counters_and_histograms_count_what_was_recorded(otel, django_capture_on_commit_callbacks):
    _, reader = otel
    with django_capture_on_commit_callbacks(execute=True):
        jobqueue.enqueue("test.add", {"a": 1, "b": 2})
        jobqueue.enqueue("otel.broken", max_attempts=2)
    run_jobs()
    found = collect(reader)
    add, broken = key("test.add"), key("otel.broken")
    assert found["jobqueue.jobs.enqueued"] == {add: 1, broken: 1}
    assert found["jobqueue.jobs.started"] == {add: 1, broken: 2}
    assert found["jobqueue.jobs.finished"] == {key("test.add", state="done"): 1}
    assert found["jobqueue.jobs.failed"] == {
        key("otel.broken", state="scheduled"): 1,  # its retry, after a backoff
        key("otel.broken", state="dead"): 1,
    }
    assert found["jobqueue.jobs.dead"] == {broken: 1}
    assert sum(found["messaging.process.duration"].values()) == 3  # one per attempt
    assert sum(found["jobqueue.job.wait"].values()) == 2  # first attempts only


def test_the_checks_say_nothing_when_the_api_is_installed(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "OPENTELEMETRY": True}
    assert not [m for m in run_checks() if m.id == "django_jobqueue.W006"]
    json.dumps(conf.get().opentelemetry)
