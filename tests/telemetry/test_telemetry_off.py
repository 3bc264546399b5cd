"""JOBQUEUE["OPENTELEMETRY"] off, or on without opentelemetry-api: everything works, and
nothing of OpenTelemetry is imported (each in a fresh interpreter, which the test process
is not: other tests import the SDK)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import worker_environment

pytestmark = pytest.mark.django_db(transaction=True)


def test_with_the_setting_off_nothing_of_opentelemetry_is_imported():
    script = (
        "import sys, django; django.setup()\n"
        "import django_jobqueue as jobqueue\n"
        "from django_jobqueue import telemetry, worker\n"
        "from django_jobqueue.engine import attempts, durable, enqueuing, occupancy, outcomes\n"
        "from django_jobqueue.worker import gauges\n"
        "from django_jobqueue.testing import run_jobs\n"
        "job = jobqueue.enqueue('test.add', {'a': 1, 'b': 2})\n"
        "run_jobs()\n"
        "job.refresh_from_db()\n"
        "print(job.state, job.traceparent, telemetry.active,\n"
        "      sorted(m for m in sys.modules if m.split('.')[0] == 'opentelemetry'))\n"
    )
    out = _python(script, {})
    assert out == "done None None []"


def test_without_opentelemetry_api_the_setting_warns_and_changes_nothing():
    script = (
        "import sys\n"
        "class Absent:\n"  # opentelemetry-api not installed, as far as this process can tell
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'opentelemetry':\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, Absent())\n"
        "import django; from django.conf import settings\n"
        "django.setup()\n"
        "settings.JOBQUEUE['OPENTELEMETRY'] = True\n"
        "from django.core.checks import run_checks\n"
        "from django_jobqueue import telemetry\n"
        "telemetry.configure()\n"
        "import django_jobqueue as jobqueue\n"
        "from django_jobqueue.testing import run_jobs\n"
        "job = jobqueue.enqueue('test.add', {'a': 1, 'b': 2})\n"
        "run_jobs()\n"
        "job.refresh_from_db()\n"
        "ids = [m.id for m in run_checks() if m.id.startswith('django_jobqueue')]\n"
        "print(job.state, telemetry.active, ids)\n"
    )
    out = _python(script, {})
    assert out == "done None ['django_jobqueue.W006']"


def _python(script: str, env: dict[str, str]) -> str:
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=worker_environment(env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]
