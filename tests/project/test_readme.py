"""The README's quick start, run as written: a fresh venv, `pip install` of this checkout, a new
project from `django-admin startproject`, the handlers, an enqueue and a burst worker.

The README marks each block it wants run with an HTML comment just before it:
`<!-- quickstart: sh -->` (shell lines, run in order with the venv activated once it exists),
`<!-- quickstart: append PATH -->` (Python appended to a file), `<!-- quickstart: file PATH -->`
(a file written) and `<!-- quickstart: append-postgres PATH -->` (appended only when the run
is on PostgreSQL, with the database's name replaced by one of the test's own).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.db import connection

from tests.conftest import ROOT

MARKED_BLOCK = re.compile(
    r"<!-- quickstart: (?P<kind>[a-z-]+)(?: (?P<path>\S+))? -->\n```[a-z]*\n(?P<body>.*?)```",
    re.DOTALL,
)


@dataclass
class Step:
    kind: str
    path: str | None
    body: str


def quickstart_steps() -> list[Step]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Quick start") :]
    section = section[: section.index("\n## ", 1)]
    return [Step(m["kind"], m["path"], m["body"]) for m in MARKED_BLOCK.finditer(section)]


def test_the_readme_marks_every_quick_start_block():
    """Each fenced block of the section is marked, so none is skipped by accident."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Quick start") :]
    section = section[: section.index("\n## ", 1)]
    fences = section.count("```") // 2
    steps = quickstart_steps()
    assert len(steps) == fences
    assert [s.kind for s in steps] == ["sh", "append", "append-postgres", "file", "file", "sh"]


def base_python() -> str:
    """The interpreter behind this test run's venv, to play the user's `python3`."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidate = Path(sys.base_prefix) / "bin" / version
    return str(candidate if candidate.exists() else Path(sys._base_executable))  # type: ignore[attr-defined]


def user_environment() -> dict[str, str]:
    """This process's environment without the test run's Django, database and coverage set-up."""
    prefixes = ("DJANGO_", "DATABASE_", "JOBQUEUE_", "COVERAGE", "VIRTUAL_ENV")
    return {key: value for key, value in os.environ.items() if not key.startswith(prefixes)}


def run_quickstart(tmp_path: Path, postgres_name: str | None) -> Path:
    """Follow the quick start in `tmp_path`; return the project directory."""
    project = tmp_path / "project"
    project.mkdir()
    # The clone, next to the project. A copy: pip builds in the source tree, and the lanes of
    # the other databases may be installing theirs from the same checkout at the same time.
    shutil.copytree(
        ROOT,
        tmp_path / "django-jobqueue",
        ignore=shutil.ignore_patterns(".*", "__pycache__", "*.egg-info", "build", "db.sqlite3*"),
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(base_python())
    env = user_environment()
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    for step in quickstart_steps():
        if step.kind == "sh":
            lines = [ln for ln in step.body.splitlines() if ln.strip()]
            script = "set -euo pipefail\n"
            if (project / ".venv").exists():
                script += ". .venv/bin/activate\n"
            for line in lines:
                script += line.split("  #")[0].rstrip() + "\n"
            done = subprocess.run(
                ["bash", "-c", script],
                cwd=project,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert done.returncode == 0, (
                f"{script}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
            )
        elif step.kind == "append":
            with (project / str(step.path)).open("a") as f:
                f.write("\n" + step.body)
        elif step.kind == "append-postgres":
            if postgres_name is not None:
                body = step.body.replace('"NAME": "mysite"', f'"NAME": "{postgres_name}"')
                assert body != step.body, "the PostgreSQL block names the database 'mysite'"
                with (project / str(step.path)).open("a") as f:
                    f.write("\n" + body)
        elif step.kind == "file":
            (project / str(step.path)).write_text(step.body)
        else:  # pragma: no cover - the marker list is checked above
            raise AssertionError(f"unknown quick start step {step.kind!r}")
    return project


def project_python(project: Path, *args: str) -> str:
    """Run the project venv's python with `args` in the project; return its stdout."""
    done = subprocess.run(
        [".venv/bin/python", *args],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
        env=user_environment(),
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def project_states(project: Path) -> dict[str, object]:
    return json.loads(project_python(project, "manage.py", "jobqueue_stats", "--json"))


def project_results(project: Path) -> list[tuple[str, str, object]]:
    code = (
        "import json; from django_jobqueue.models import Job; "
        "print(json.dumps(list(Job.objects.order_by('id').values_list('type', 'state', 'result'))))"
    )
    out = project_python(project, "manage.py", "shell", "-c", code)
    # Django 6's shell first reports the objects it imported automatically.
    return [tuple(row) for row in json.loads(out.strip().splitlines()[-1])]


def check_installed_package(project: Path) -> None:
    """The installed (not editable) package carries its templates, its static files and the
    licence text."""
    code = (
        "import importlib.metadata as m, pathlib, django_jobqueue; "
        "print(pathlib.Path(django_jobqueue.__file__).parent); "
        "print(m.distribution('django-jobqueue').read_text('licenses/LICENSE') is not None)"
    )
    installed, has_licence = project_python(project, "-c", code).split()
    assert has_licence == "True"
    assert Path(installed).resolve() != (ROOT / "django_jobqueue").resolve()
    package = ROOT / "django_jobqueue"
    shipped = [*(package / "templates").rglob("*.html"), *(package / "static").rglob("*.*")]
    assert any(path.suffix == ".js" for path in shipped)
    for path in shipped:
        relative = path.relative_to(package)
        assert (Path(installed) / relative).exists(), relative


def assert_the_workflow_ran(project: Path) -> None:
    states = project_states(project)
    assert states["states"]["done"] == 2, states
    assert project_results(project) == [
        ("reports.fetch", "done", {"user_id": 1, "rows": 42}),
        ("reports.build", "done", "report for user 1: 42 rows"),
    ]
    check_installed_package(project)


@pytest.mark.slow
def test_the_quick_start_runs_as_written_on_sqlite(tmp_path):
    if connection.vendor != "sqlite":
        pytest.skip("the SQLite run of the quick start belongs to the SQLite lane")
    project = run_quickstart(tmp_path, postgres_name=None)
    assert (project / "db.sqlite3").exists()
    assert_the_workflow_ran(project)


@pytest.mark.slow
def test_the_quick_start_runs_as_written_on_postgresql(tmp_path):
    if connection.vendor != "postgresql":
        pytest.skip("the PostgreSQL run of the quick start belongs to the PostgreSQL lane")
    import psycopg

    name = f"jq_readme_{uuid.uuid4().hex[:8]}"
    settings = connection.settings_dict
    admin = {
        "host": settings["HOST"] or "127.0.0.1",
        "port": settings["PORT"] or 5432,
        "user": settings["USER"],
        "dbname": "postgres",
    }
    assert settings["USER"] == "postgres" and admin["host"] == "127.0.0.1", (
        "the README's PostgreSQL block logs in as postgres on 127.0.0.1"
    )
    with psycopg.connect(**admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        project = run_quickstart(tmp_path, postgres_name=name)
        assert not (project / "db.sqlite3").exists()
        assert_the_workflow_ran(project)
    finally:
        with psycopg.connect(**admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_the_readme_explains_every_option_of_the_worker_command():
    from django_jobqueue.management.commands.jobqueue_worker import Command

    parser = Command().create_parser("manage.py", "jobqueue_worker")
    own = {
        flag
        for action in parser._actions
        for flag in action.option_strings
        if flag.startswith("--") and action.dest not in _DJANGO_OPTIONS
    }
    readme = (ROOT / "README.md").read_text()
    table = {m.group(1) for m in re.finditer(r"^\| `(--[a-z-]+)", readme, re.MULTILINE)}
    assert own and own <= table, f"not in the README's option table: {sorted(own - table)}"


# Options every management command has (BaseCommand's), not the worker's own.
_DJANGO_OPTIONS = {
    "help", "version", "verbosity", "settings", "pythonpath", "traceback", "no_color",
    "force_color", "skip_checks",
}  # fmt: skip
