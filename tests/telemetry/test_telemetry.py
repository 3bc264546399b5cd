"""OpenTelemetry (JOBQUEUE["OPENTELEMETRY"]), in the test process: the trace context a job
takes from its enqueuer, the spans of attempts and steps (real SDK, in-memory exporter), the
metrics, the settings' checks. Worker processes: test_telemetry_workers.py; the setting off,
or opentelemetry-api absent: test_telemetry_off.py."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

import django_jobqueue as jobqueue
from django_jobqueue import conf, telemetry
from django_jobqueue.dialects import get_dialect
from django_jobqueue.engine import leases
from django_jobqueue.engine.fair_selection import FairShare
from django_jobqueue.models import Job, Worker
from django_jobqueue.testing import run_jobs
from django_jobqueue.worker.gauges import Gauges

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
        ({"TOKEN_RESOURCES": ["llm-input"]}, "['TOKEN_RESOURCES'] must map resources"),
        ({"TOKEN_RESOURCES": {"llm-input": "prompt"}}, "must be 'input' or 'output'"),
        (
            {"TOKEN_RESOURCES": {"llm:\x00": "input"}},
            "TOKEN_RESOURCES']: a resource name contains a NUL",
        ),
        ({"TOKEN_RESOURCES": {"llm-inptu": "input"}}, "names 'llm-inptu', which no entry"),
    ],
)
def test_bad_opentelemetry_settings_are_reported(value, message):
    found, usable = conf.examine({"OPENTELEMETRY": value, "LIMITS": TOKEN_LIMITS})
    assert any(message in p.message for p in found), found
    assert isinstance(usable.opentelemetry, bool | dict)


# Resources of the token tests: two that count tokens, a pattern of them, one that does not.
TOKEN_LIMITS = {
    "llm-input": {"rate": "1000/m"},
    "llm-output": {"rate": "1000/m"},
    "tenant-tokens:*": {"rate": "1000/m"},
    "otel-rated": {"rate": "10/s"},
}
TOKEN_RESOURCES = {"llm-input": "input", "llm-output": "output", "tenant-tokens:*": "input"}


def test_token_resources_are_checked_all_at_once_before_anything_runs():
    bad = {
        "OPENTELEMETRY": {
            "GAUGE_INTERVAL": 0,
            "TOKEN_RESOURCES": {"llm-input": "prompt", "nowhere": "output", "tenant-tokens:9": 1},
        },
        "LIMITS": TOKEN_LIMITS,
    }
    found, usable = conf.examine(bad)
    messages = [p.message for p in found]
    assert len(messages) == 4, messages
    assert "GAUGE_INTERVAL" in messages[0]
    assert "['TOKEN_RESOURCES']['llm-input'] must be 'input' or 'output'" in messages[1]
    assert "names 'nowhere', which no entry of JOBQUEUE['LIMITS'] governs" in messages[2]
    assert "['TOKEN_RESOURCES']['tenant-tokens:9'] must be 'input' or 'output'" in messages[3]
    assert usable.opentelemetry == {}  # both options dropped: the rest is usable
    with pytest.raises(ImproperlyConfigured, match="TOKEN_RESOURCES"):
        conf.load(bad)
    good = {"OPENTELEMETRY": {"TOKEN_RESOURCES": TOKEN_RESOURCES}, "LIMITS": TOKEN_LIMITS}
    assert conf.examine(good)[0] == []
    # A bad LIMITS says so itself; the names are not checked against it then.
    found, _ = conf.examine({**good, "LIMITS": {"llm-input": {"rate": "often"}}})
    assert [p.setting for p in found] == ["LIMITS"]


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


def test_token_resources_carry_the_genai_token_type_and_the_attempt_its_usage(otel, settings):
    """The counters of a resource that counts tokens carry gen_ai.token.type (a pattern's
    resources too); the attempt span sums what it settled of each type."""
    _, reader = otel
    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "LIMITS": TOKEN_LIMITS,
        "OPENTELEMETRY": {"TOKEN_RESOURCES": TOKEN_RESOURCES},
    }
    (span,) = ran(otel, "otel.tokens")["process otel.tokens"]
    assert span.attributes["jobqueue.outcome"] == "succeeded"
    assert span.attributes["gen_ai.usage.input_tokens"] == 100  # 80 + 20 (tenant-tokens:7)
    assert span.attributes["gen_ai.usage.output_tokens"] == 30
    found = collect(reader)

    def unit(resource: str, kind: str | None = None) -> tuple[Any, ...]:
        attributes = {"jobqueue.limit.resource": resource}
        if kind is not None:
            attributes["gen_ai.token.type"] = kind
        return tuple(sorted(attributes.items()))

    assert found["jobqueue.limit.units.granted"] == {
        unit("llm-input", "input"): 100,
        unit("llm-output", "output"): 50,
        unit("tenant-tokens:7", "input"): 40,
        unit("otel-rated"): 3,
    }
    assert found["jobqueue.limit.units.settled"] == {
        unit("llm-input", "input"): 80,
        unit("llm-output", "output"): 30,
        unit("tenant-tokens:7", "input"): 20,
        unit("otel-rated"): 2,
    }


def test_an_async_attempt_sums_the_tokens_it_settled(otel, settings):
    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "LIMITS": TOKEN_LIMITS,
        "OPENTELEMETRY": {"TOKEN_RESOURCES": TOKEN_RESOURCES},
    }
    (span,) = ran(otel, "otel.async_tokens")["process otel.async_tokens"]
    assert span.attributes["gen_ai.usage.input_tokens"] == 80
    assert span.attributes["gen_ai.usage.output_tokens"] == 30


def test_an_attempt_that_settles_no_tokens_has_no_usage_attributes(otel, settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "LIMITS": TOKEN_LIMITS, "OPENTELEMETRY": True}
    (span,) = ran(otel, "otel.tokens")["process otel.tokens"]  # nothing declared to count them
    assert not [name for name in span.attributes if name.startswith("gen_ai.")]


@pytest.mark.django_db(transaction=True)
def test_one_worker_reads_what_each_limit_holds_for_the_gauges(otel, settings):
    """The live worker with the smallest id that records metrics reads the units the jobs in
    flight hold; the declared resources always, a pattern's only while they hold something
    (then a last 0); another worker reports nothing."""
    _, reader = otel
    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "LIMITS": {**HOLD_LIMITS, "llm-input": {"rate": "1000/m"}},
        "OPENTELEMETRY": {"TOKEN_RESOURCES": {"llm-input": "input"}},
    }
    for worker_id in ("a-first", "b-second"):
        now = timezone.now()
        Worker.objects.create(
            id=worker_id, host="here", pid=1, queues=[], concurrency=1, started_at=now,
            heartbeat_at=now, expires_at=now + dt.timedelta(hours=1), metrics=True,
        )  # fmt: skip
    held = jobqueue.enqueue("test.noop", uses={"otel-slots": 2, "tenant:7": 1})
    jobqueue.enqueue("test.noop", uses={"tenant:8": 1})
    dialect = get_dialect("default")
    assert len(leases.claim(dialect, owner="a-first", queues=[], limit=10, lease_ttl=60,
                            fair_share=FairShare(conf.get()))) == 2  # fmt: skip
    first, second = (
        Gauges(dialect, worker_id=w, interval=1.0, lock_timeout=5.0)
        for w in ("a-first", "b-second")
    )
    second.tick()
    hooks = telemetry.active
    assert hooks is not None and hooks.limits is None
    assert "jobqueue.limit.occupancy" not in collect(reader)
    first.tick()
    assert hooks.limits == {
        "llm-input": (0, None),
        "otel-slots": (2, 5),
        "tenant:7": (1, 3),
        "tenant:8": (1, 3),
    }
    found = collect(reader)
    resource = "jobqueue.limit.resource"
    assert found["jobqueue.limit.occupancy"] == {
        ((resource, "otel-slots"),): 2,
        ((resource, "tenant:7"),): 1,
        ((resource, "tenant:8"),): 1,
    }  # and llm-input's 0 (collect leaves zeros out), with its token type:
    assert [o.attributes for o in hooks._observe_occupancy() if o.value == 0] == [
        {resource: "llm-input", "gen_ai.token.type": "input"}
    ]
    assert found["jobqueue.limit.capacity"] == {
        ((resource, "otel-slots"),): 5,
        ((resource, "tenant:7"),): 3,
        ((resource, "tenant:8"),): 3,
    }
    Job.objects.exclude(pk=held.pk).update(
        state="done", lease_owner=None, lease_expires=None, finished_at=timezone.now()
    )
    first.tick()  # tenant:8 holds nothing now: a last 0
    assert hooks.limits["tenant:8"] == (0, 3) and hooks.limits["tenant:7"] == (1, 3)
    first.tick()  # then no more
    assert sorted(hooks.limits) == ["llm-input", "otel-slots", "tenant:7"]
    first.finish()
    assert hooks.limits is None


HOLD_LIMITS = {"otel-slots": {"concurrency": 5}, "tenant:*": {"concurrency": 3}}
