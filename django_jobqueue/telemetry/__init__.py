"""The hook through which the queue reports traces and metrics: None unless turned on.

`active` is None unless ``JOBQUEUE["OPENTELEMETRY"]`` is on and ``opentelemetry-api`` is
installed. Every call site tests that one attribute and does nothing more when it is None, so
the hot path pays one attribute test; nothing of OpenTelemetry is imported then. On, it is an
`otel.OpenTelemetry`, which holds every OpenTelemetry call of the package and reports through
the application's own tracer and meter providers (it never configures an exporter).

`configure()` sets it from the settings: at start-up (`apps.ready`), and again when a test
changes ``JOBQUEUE`` (Django's `setting_changed`).
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .otel import OpenTelemetry

logger = logging.getLogger(__name__)

active: OpenTelemetry | None = None
_lock = threading.Lock()


def installed() -> bool:
    """Whether `opentelemetry-api` can be imported (found without importing it)."""
    try:
        return importlib.util.find_spec("opentelemetry.trace") is not None
    except (ImportError, ValueError):  # the namespace package itself is missing
        return False


def configure(value: bool | dict[str, Any] | None = None) -> None:
    """Turn the hook on or off for an ``OPENTELEMETRY`` setting (None: read the settings)."""
    global active
    from .. import conf

    if value is None:
        value = conf.examine()[1].opentelemetry  # bad values are the checks' to report
    options = conf.telemetry_options(value)
    with _lock:
        previous, active = active, None
        if previous is not None:
            previous.close()
        if options is None:
            return
        if not installed():
            logger.warning(
                "JOBQUEUE['OPENTELEMETRY'] is on but opentelemetry-api is not installed: "
                "install django-jobqueue[otel]; nothing is traced meanwhile"
            )
            return
        from .otel import OpenTelemetry

        active = OpenTelemetry(options)


def on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    """Follow a change of ``JOBQUEUE`` (override_settings in tests)."""
    if setting == "JOBQUEUE":
        configure()
