"""`make demo` and `make demo-site`: what they install, the admin login, and the story itself.

The example project runs with its own settings (config.settings), so these tests drive it in
subprocesses, each on an SQLite database of its own under tmp_path.
"""

from __future__ import annotations

import os
import re
import socket
import sqlite3
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path
from typing import Any

import django
import pytest

from tests.admin.test_admin_browser import browser, shots  # noqa: F401  (fixtures)
from tests.support.browser_support import log_in, watch_problems

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "example_project"
# What `make demo` must never install: database drivers (mysqlclient needs the MySQL client
# headers to build), and the test and dev toolchains.
HEAVY = {
    "mysqlclient", "psycopg", "psycopg-binary", "psycopg2", "pytest", "pytest-django",
    "pytest-cov", "factory-boy", "hypothesis", "ruff", "mypy", "django-stubs", "mkdocs",
    "playwright",
}  # fmt: skip


# The example project needs django.tasks (Django 6.0+), and runs on SQLite files of its own:
# once per suite run is enough, in its SQLite run.
example_project = pytest.mark.skipif(
    django.VERSION < (6, 0)
    or not (os.environ.get("DATABASE_URL") or "sqlite:").startswith("sqlite"),
    reason="the example project needs Django 6.0+; it is tested in the SQLite run of the suite",
)


def _name(requirement: str) -> str:
    """The normalised project name of a requirement string, extras and versions dropped."""
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip())
    assert match, requirement
    return re.sub(r"[._-]+", "-", match.group()).lower()


def test_the_demo_extra_holds_no_database_driver_nor_dev_tool() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    demo = project["optional-dependencies"]["demo"]
    names = {_name(r) for r in [*demo, *project["dependencies"]]}
    assert not names & HEAVY
    assert not any(r.startswith("django-jobqueue[") for r in demo)  # no other extra pulled in
    assert {"django", "django-environ", "rich"} <= names


def test_make_demo_installs_only_the_demo_extra() -> None:
    makefile = (ROOT / "Makefile").read_text()
    installs = [
        line.strip() for line in makefile.splitlines() if "$(DEMO_BIN)/python -m pip" in line
    ]
    assert installs[-1] == '$(DEMO_BIN)/python -m pip install --quiet -e ".[demo]"'
    assert all("dev" not in line and "test" not in line for line in installs)
    assert re.search(r"^demo: demo-venv$", makefile, re.MULTILINE)
    assert re.search(r"^demo-site: demo-venv$", makefile, re.MULTILINE)
    assert "unexport DATABASE_URL" in (EXAMPLE / "Makefile").read_text()  # SQLite only


def _manage(python: str, db: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "DATABASE_URL": f"sqlite:///{db}", **env}
    environ.pop("DJANGO_SETTINGS_MODULE", None)  # manage.py sets config.settings
    return subprocess.run(
        [python, "manage.py", *args], cwd=EXAMPLE, env=environ, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


ADMIN_PAGES = """
from django.core.management import call_command
from django.test import Client
from django.test.utils import setup_test_environment
from django_jobqueue.models import Job

call_command("shop_place_order", "--total", "25.00")
call_command("shop_demo_admin")
call_command("shop_demo_admin")
setup_test_environment()
client = Client()
assert client.login(username="admin", password="admin")
job = Job.objects.get(type="shop.send_receipt")
pages = [
    "/admin/",
    "/admin/django_jobqueue/job/",
    f"/admin/django_jobqueue/job/{job.pk}/change/",
    "/admin/django_jobqueue/worker/",
    "/admin/shop/order/",
]
for url in pages:
    response = client.get(url)
    print(url, response.status_code, b"<svg" in response.content)
"""


@example_project
def test_the_demo_site_has_an_admin_login_and_working_pages(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite3"
    _ok(_manage(sys.executable, db, "migrate", "--verbosity", "0"))
    out = _ok(_manage(sys.executable, db, "shell", "-c", ADMIN_PAGES))
    assert "Created the superuser 'admin' (password 'admin')" in out
    assert "Updated the superuser 'admin'" in out  # run again: the same login, reset
    assert "http://127.0.0.1:8000/admin/" in out
    pages = [line for line in out.splitlines() if line.startswith("/admin/")]
    assert [line.split()[1] for line in pages] == ["200"] * 5, out
    assert pages[2].endswith("True"), "the job page draws its workflow"


def test_make_demo_site_takes_a_port() -> None:
    def planned(target: str, *args: str) -> str:
        return subprocess.run(
            ["make", "--no-print-directory", "-n", target, *args, "DEMO_BIN=/nowhere"],
            cwd=ROOT, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip

    assert "runserver 127.0.0.1:8000" in planned("demo-site")
    site = planned("demo-site", "PORT=8001")
    assert "runserver 127.0.0.1:8001" in site and "shop_demo_admin --port 8001" in site
    assert "shop_demo --port 8001" in planned("demo", "PORT=8001")


@example_project
def test_the_demo_site_prints_links_for_its_port(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite3"
    _ok(_manage(sys.executable, db, "migrate", "--verbosity", "0"))
    out = _ok(_manage(sys.executable, db, "shop_demo_admin", "--port", "8001"))
    assert "Open http://127.0.0.1:8001/admin/" in out and "8000" not in out


@example_project
def test_the_demo_admin_login_needs_debug(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite3"
    _ok(_manage(sys.executable, db, "migrate", "--verbosity", "0"))
    result = _manage(sys.executable, db, "shop_demo_admin", DEBUG="false")
    assert result.returncode != 0
    assert "only with DEBUG on and an SQLite database" in result.stderr


@pytest.mark.slow
@pytest.mark.browser
@example_project
def test_make_demo_tells_its_story_end_to_end(
    tmp_path: Path,
    browser: Any,  # noqa: F811
    shots: Path,  # noqa: F811
) -> None:
    """The demo's own venv (built by `make demo-venv` if needed) runs the whole story; then
    the example site shows what it left, in a real browser, which takes the docs' pictures
    (JOBQUEUE_ADMIN_SCREENSHOTS=docs/content/img/admin refreshes them)."""
    subprocess.run(["make", "--no-print-directory", "demo-venv"], cwd=ROOT, check=True)
    python = str(ROOT / ".venv-demo" / "bin" / "python")
    db, svg, log = tmp_path / "db.sqlite3", tmp_path / "workflow.svg", tmp_path / "worker.log"
    _ok(_manage(python, db, "migrate", "--verbosity", "0"))
    out = _ok(_manage(python, db, "shop_demo", "--svg", str(svg), "--worker-log", str(log)))
    assert "Everything went as told" in out
    # It ends on the command that opens the site, then the two pages the story ends on.
    last = [line.strip() for line in out.rstrip().splitlines()[-6:]]
    assert "make demo-site" in last
    assert any(line.endswith("/admin/django_jobqueue/queueoverview/") for line in last)
    assert last[-1].startswith("http://127.0.0.1:8000/admin/django_jobqueue/job/")
    assert "The worker recorded its figures minute by minute" in out
    for told in ("failed attempt 1", "is dead", "jobqueue.retry(", "jobqueue.cancel("):
        assert told in out
    picture = svg.read_text()
    assert picture.startswith("<?xml") and "catalogue-acme" in picture
    assert 'href="http://127.0.0.1:8000/admin/django_jobqueue/job/' in picture
    assert "Job id=" in log.read_text()  # the worker's own log

    again = _manage(python, db, "shop_demo", "--svg", str(svg), "--worker-log", str(log))
    assert again.returncode != 0 and "fresh database" in again.stderr
    _tour_the_demo_site(python, db, browser, shots)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tour_the_demo_site(python: str, db: Path, chromium: Any, folder: Path) -> None:
    """`make demo-site` after the demo: the overview, the job left waiting for its event and
    the Limits page with the paused tenant, each without a console error, photographed."""
    _ok(_manage(python, db, "shop_demo_admin"))
    with sqlite3.connect(db) as connection:
        (waiting,) = connection.execute(
            "SELECT id FROM django_jobqueue_job WHERE type = 'shop.monthly_report' "
            "AND state = 'waiting'"
        ).fetchone()
    port = _free_port()
    environ = {**os.environ, "DATABASE_URL": f"sqlite:///{db}"}
    environ.pop("DJANGO_SETTINGS_MODULE", None)
    server = subprocess.Popen(
        [python, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
        cwd=EXAMPLE, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{base}/admin/login/", timeout=5).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "no site"
                time.sleep(0.5)
        page = chromium.new_page(viewport={"width": 1400, "height": 900})
        page.set_default_timeout(120_000)
        problems = watch_problems(page)
        log_in(page, base, "admin", "admin")
        page.goto(f"{base}/admin/django_jobqueue/queueoverview/")
        page.wait_for_selector("#content-main")
        page.screenshot(path=folder / "demo-overview.png", full_page=True)
        page.goto(f"{base}/admin/django_jobqueue/job/{waiting}/change/")
        text = page.inner_text("#content")
        assert "approve-report:2026-12" in text, text[:2000]
        page.screenshot(path=folder / "demo-job-waiting.png")
        page.goto(f"{base}/admin/django_jobqueue/limit/")
        text = page.inner_text("#content")
        assert "tenant:globex" in text and "paused" in text.lower(), text[:2000]
        page.screenshot(path=folder / "demo-limits.png", full_page=True)
        page.close()
        assert problems == []
    finally:
        server.terminate()
        server.wait(timeout=30)
