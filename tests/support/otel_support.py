"""The OpenTelemetry SDK of the telemetry tests (tests/telemetry/test_telemetry*.py): real
providers.

In the test process, `in_memory()` installs (once) an SDK tracer provider exporting to an
InMemorySpanExporter and a meter provider read by an InMemoryMetricReader. A worker
subprocess started with JOBQUEUE_TEST_OTEL=<dir> (see tests/settings.py) calls `to_files(dir)`:
its spans, metrics and log records go to JSON-lines files there, which the test reads back.
Also a view that enqueues (the request of the end-to-end test) and its URLconf.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.urls import path
from opentelemetry import metrics, trace
from opentelemetry.sdk import _logs as sdk_logs
from opentelemetry.sdk._logs import export as log_export
from opentelemetry.sdk.metrics import (
    Counter,
    Histogram,
    MeterProvider,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
    UpDownCounter,
)
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    InMemoryMetricReader,
    MetricExporter,
    MetricExportResult,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import django_jobqueue as jobqueue

# The handlers' logger, whose records the worker exports with their trace and span ids.
JOB_LOGGER = "tests.otel_jobs"
# SDK versions name the log exporter's base class differently.
_LogExporter: Any = getattr(log_export, "LogRecordExporter", None) or log_export.LogExporter

_installed: tuple[InMemorySpanExporter, InMemoryMetricReader] | None = None


def in_memory() -> tuple[InMemorySpanExporter, InMemoryMetricReader]:
    """The test process's SDK: installed at the first call (a process has one provider)."""
    global _installed
    if _installed is None:
        # Delta temporality: each collection holds what happened since the one before.
        delta: dict[type, AggregationTemporality] = dict.fromkeys(
            (Counter, UpDownCounter, Histogram, ObservableCounter, ObservableUpDownCounter,
             ObservableGauge),
            AggregationTemporality.DELTA,
        )  # fmt: skip
        spans, reader = InMemorySpanExporter(), InMemoryMetricReader(preferred_temporality=delta)
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        _installed = spans, reader
    return _installed


class _Lines:
    """Append JSON lines to a file, from any thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()

    def write(self, lines: list[str]) -> None:
        with self.lock, self.path.open("a") as out:
            out.write("".join(f"{line}\n" for line in lines))


class FileSpanExporter(SpanExporter):
    def __init__(self, path: Path) -> None:
        self.out = _Lines(path)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.out.write([span.to_json(indent=None) for span in spans])
        return SpanExportResult.SUCCESS


class FileMetricExporter(MetricExporter):
    def __init__(self, path: Path) -> None:
        super().__init__()
        self.out = _Lines(path)

    def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
        self.out.write([metrics_data.to_json(indent=None)])
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass


class FileLogExporter(_LogExporter):  # type: ignore[misc]
    def __init__(self, path: Path) -> None:
        self.out = _Lines(path)

    def export(self, batch: Sequence[Any]) -> Any:
        self.out.write([record.to_json(indent=None) for record in batch])
        result = getattr(log_export, "LogRecordExportResult", None) or log_export.LogExportResult
        return result.SUCCESS

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True

    def shutdown(self) -> None:
        pass


def to_files(directory: Path) -> None:
    """A worker's SDK: every span sampled, exported to files of `directory`; the logging
    integration (the SDK's LoggingHandler) on the handlers' logger."""
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(FileSpanExporter(directory / "spans")))
    trace.set_tracer_provider(tracer_provider)
    reader = PeriodicExportingMetricReader(
        FileMetricExporter(directory / "metrics"), export_interval_millis=300
    )
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    logger_provider = sdk_logs.LoggerProvider()
    logger_provider.add_log_record_processor(
        log_export.SimpleLogRecordProcessor(FileLogExporter(directory / "logs"))
    )
    handler = sdk_logs.LoggingHandler(level=logging.INFO, logger_provider=logger_provider)
    logger = logging.getLogger(JOB_LOGGER)
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)


def collect(reader: InMemoryMetricReader) -> dict[str, dict[tuple[tuple[str, Any], ...], Any]]:
    """{metric name: {sorted attributes: value (a histogram's: its count)}} collected now,
    without the points that did not change since the last collection (deltas of 0)."""
    found: dict[str, dict[tuple[tuple[str, Any], ...], Any]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    key = tuple(sorted((point.attributes or {}).items()))
                    value = point.count if hasattr(point, "count") else point.value
                    if value == 0:
                        continue
                    found.setdefault(metric.name, {})[key] = value
    return found


def read(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of `path` (none if it is missing)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def enqueue_view(request: HttpRequest) -> JsonResponse:
    """The request of the end-to-end test: enqueue the pipeline."""
    job = jobqueue.enqueue("otel.pipeline")
    return JsonResponse({"job": job.pk})


urlpatterns = [path("otel/enqueue/", enqueue_view)]
