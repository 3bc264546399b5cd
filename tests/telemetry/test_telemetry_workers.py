"""OpenTelemetry end to end: a request (inside a span) enqueues a job that has two steps, a
sleep and a spawned child; a worker process runs it with an SDK that exports its spans,
metrics and log records to files (tests/support/otel_support.py), which the test reads back."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from django.utils import timezone
from opentelemetry import trace
from opentelemetry.trace import SpanKind

import django_jobqueue as jobqueue
from django_jobqueue.models import Job, Worker
from tests.conftest import poll, wait_for_job
from tests.support.otel_support import collect, in_memory, read
from tests.support.workflow_support import FAST

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def hex_id(value: str) -> str:
    return value.removeprefix("0x")


def last_export(directory: Path) -> dict[str, dict[tuple[Any, ...], Any]]:
    """The worker's latest metrics export: {name: {sorted attributes: value or count}}."""
    exports = read(directory / "metrics")
    if not exports:
        return {}
    found: dict[str, dict[tuple[Any, ...], Any]] = {}
    for resource in exports[-1]["resource_metrics"]:
        for scope in resource["scope_metrics"]:
            for metric in scope["metrics"]:
                for point in metric["data"]["data_points"]:
                    key = tuple(sorted(point["attributes"].items()))
                    found.setdefault(metric["name"], {})[key] = point.get(
                        "count", point.get("value")
                    )
    return found


def test_a_request_its_job_steps_sleep_and_child_are_one_trace(
    client, settings, start_worker, tmp_path
):
    spans, reader = in_memory()
    spans.clear()
    reader.get_metrics_data()
    settings.JOBQUEUE = {**settings.JOBQUEUE, "OPENTELEMETRY": True}
    settings.ROOT_URLCONF = "tests.support.otel_support"
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("POST /otel/enqueue/", kind=SpanKind.SERVER) as request:
        job_id = client.post("/otel/enqueue/").json()["job"]
    request_ids = request.get_span_context()
    trace_id, request_span = (
        format(request_ids.trace_id, "032x"),
        format(request_ids.span_id, "016x"),
    )
    assert collect(reader)["jobqueue.jobs.enqueued"]  # counted in the request's process

    worker = start_worker("--queue", "default", *FAST, env={"JOBQUEUE_TEST_OTEL": str(tmp_path)})
    done = wait_for_job(job_id, Job.State.DONE, Job.State.DEAD, timeout=90)
    assert done.state == Job.State.DONE
    (child,) = Job.objects.filter(parent_id=job_id)
    assert child.state == Job.State.DONE

    def exported() -> list[dict[str, Any]] | None:
        found = read(tmp_path / "spans")
        names = [s["name"] for s in found]
        wanted = names.count("process otel.pipeline") == 2 and "process otel.child" in names
        return found if wanted else None

    found = poll(exported, timeout=30)
    assert {hex_id(s["context"]["trace_id"]) for s in found} == {trace_id}  # one trace
    by_id = {hex_id(s["context"]["span_id"]): s for s in found}

    def parent_of(span: dict[str, Any]) -> str:
        return hex_id(span["parent_id"] or "")

    attempts = sorted(
        (s for s in found if s["name"] == "process otel.pipeline"), key=lambda s: s["start_time"]
    )
    first, second = attempts
    for attempt in attempts:  # children of the request
        assert parent_of(attempt) == request_span
        assert not attempt["links"]
        assert attempt["kind"] == "SpanKind.CONSUMER"
        attributes = attempt["attributes"]
        assert attributes["messaging.system"] == "django_jobqueue"
        assert attributes["messaging.operation.name"] == "process"
        assert attributes["messaging.destination.name"] == "default"
        assert attributes["messaging.message.id"] == str(job_id)
        assert attributes["messaging.client.id"] == worker.row().id
        assert attributes["jobqueue.job.type"] == "otel.pipeline"
    assert first["attributes"]["jobqueue.outcome"] == "suspended"
    assert [e["name"] for e in first["events"]] == ["jobqueue.sleep"]
    assert second["attributes"]["jobqueue.outcome"] == "succeeded"

    steps = {s["name"]: s for s in found if s["name"].startswith("step ")}
    assert sorted(steps) == ["step fetch", "step store"]  # the replayed fetch has no span
    assert by_id[parent_of(steps["step fetch"])] is first
    assert by_id[parent_of(steps["step store"])] is second
    (child_span,) = [s for s in found if s["name"] == "process otel.child"]
    assert by_id[parent_of(child_span)] is second  # spawned in the second run
    assert child_span["attributes"]["messaging.message.id"] == str(child.pk)

    # The log records the handlers wrote carry the ids of the span they ran in.
    logs = poll(lambda: len(read(tmp_path / "logs")) >= 3 and read(tmp_path / "logs"))
    spans_of = {r["body"]: hex_id(r["span_id"]) for r in logs}
    assert {hex_id(r["trace_id"]) for r in logs} == {trace_id}
    assert spans_of["fetching"] == hex_id(steps["step fetch"]["context"]["span_id"])
    assert spans_of["spawned the child"] == hex_id(second["context"]["span_id"])
    assert spans_of["child of 3"] == hex_id(child_span["context"]["span_id"])

    def counted() -> dict[str, Any] | None:
        found = last_export(tmp_path)
        ready = found.get("jobqueue.jobs.finished", {})
        return found if sum(ready.values()) == 2 else None

    figures = poll(counted, timeout=30)
    by_type = {
        name: {dict(key)["jobqueue.job.type"]: value for key, value in points.items()}
        for name, points in figures.items()
        if name.startswith("jobqueue.jobs.")
    }
    assert by_type["jobqueue.jobs.started"] == {"otel.pipeline": 2, "otel.child": 1}
    assert by_type["jobqueue.jobs.finished"] == {"otel.pipeline": 1, "otel.child": 1}
    assert by_type["jobqueue.jobs.enqueued"] == {"otel.child": 1}  # the worker spawned it
    assert "jobqueue.jobs.failed" not in by_type
    durations = figures["messaging.process.duration"]
    assert sum(durations.values()) == 2  # the suspended run recorded no outcome signal
    (leases,) = figures["jobqueue.leases.in_flight"].items()
    assert leases == ((("messaging.client.id", worker.row().id),), 0)

    # A job in a queue this worker does not serve waits: the worker that records metrics
    # reports the gauges, though a live worker with a smaller id (with metrics off) is there.
    now = timezone.now()
    Worker.objects.create(
        id="0-metrics-off",
        host="elsewhere",
        pid=1,
        queues=["other"],
        concurrency=1,
        started_at=now,
        heartbeat_at=now,
        expires_at=now + dt.timedelta(hours=1),
    )
    assert worker.row().metrics and not Worker.objects.get(pk="0-metrics-off").metrics
    jobqueue.enqueue("test.noop", queue="parked")
    parked = (("messaging.destination.name", "parked"),)
    gauges = poll(lambda: last_export(tmp_path).get("jobqueue.queue.ready", {}).get(parked))
    assert gauges == 1
    assert last_export(tmp_path)["jobqueue.queue.oldest_ready_age"][parked] >= 0


def test_one_worker_of_two_reports_what_each_limit_holds(settings, start_worker, tmp_path):
    """Two workers record metrics: the one with the smallest id reports the limit gauges (the
    units the running jobs hold, each resource's concurrency), the other none."""
    limits = {"otel-slots": {"concurrency": 5}, "tenant:*": {"concurrency": 3}}
    settings.JOBQUEUE = {**settings.JOBQUEUE, "LIMITS": limits}
    dirs = {}
    for name in ("one", "two"):
        directory = tmp_path / name
        directory.mkdir()
        env = {"JOBQUEUE_TEST_OTEL": str(directory), "JOBQUEUE_TEST_LIMITS": json.dumps(limits)}
        worker = start_worker("--queue", "default", "--concurrency", "2", *FAST, env=env)
        dirs[worker.wait_registered().id] = directory
    ids = Worker.objects.filter(id__in=dirs).order_by("id").values_list("id", flat=True)
    reporter, other = (dirs[worker_id] for worker_id in ids)  # in the database's order
    flag = tmp_path / "flag"
    jobs = [
        jobqueue.enqueue("otel.hold", {"flag": str(flag)}, uses={"otel-slots": 2, "tenant:7": 1}),
        jobqueue.enqueue("otel.hold", {"flag": str(flag)}, uses={"tenant:8": 1}),
    ]
    poll(lambda: Job.objects.filter(state=Job.State.RUNNING).count() == 2)

    def gauge(directory: Path, name: str) -> dict[str, Any]:
        points = last_export(directory).get(name, {})
        return {dict(key)["jobqueue.limit.resource"]: value for key, value in points.items()}

    held = {"otel-slots": 2, "tenant:7": 1, "tenant:8": 1}
    poll(lambda: gauge(reporter, "jobqueue.limit.occupancy") == held, timeout=30)
    assert gauge(reporter, "jobqueue.limit.capacity") == {"otel-slots": 5, "tenant:7": 3,
                                                          "tenant:8": 3}  # fmt: skip
    # Its exports from now on (before the second worker registered, the first one was the
    # smallest live id for a moment), several of them: none has a point of the limit gauges.
    since = len(read(other / "metrics"))
    poll(lambda: len(read(other / "metrics")) >= since + 3, timeout=30)
    for export in read(other / "metrics")[since:]:
        for resource in export["resource_metrics"]:
            for scope in resource["scope_metrics"]:
                for metric in scope["metrics"]:
                    if metric["name"].startswith("jobqueue.limit."):
                        assert not metric["data"]["data_points"], metric
    flag.touch()
    for job in jobs:
        assert wait_for_job(job.pk, Job.State.DONE, Job.State.DEAD).state == Job.State.DONE
    poll(lambda: gauge(reporter, "jobqueue.limit.occupancy").get("otel-slots") == 0, timeout=30)
