"""The admin in a real browser: Playwright driving Debian's chromium against a live server.

Real jobs behind every page: some running under a `jobqueue_worker` subprocess, some dead, a
workflow with a container. The test logs in, opens each page, retries and cancels through the
actions bar, and checks what the pages then show. Screenshots go to a temporary directory, or
to JOBQUEUE_ADMIN_SCREENSHOTS (docs/content/img/admin refreshes the docs' pictures).

With CI=true a missing chromium or playwright is a failure, never a skip.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

import django_jobqueue as jobqueue
from django_jobqueue.models import Job, Worker
from tests.conftest import poll, wait_for_job
from tests.support import admin_support as support
from tests.support.admin_support import url
from tests.support.browser_support import log_in
from tests.support.workflow_support import FAST

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]

CHROMIUM = "/usr/bin/chromium"
PASSWORD = "browser-test-pw"


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"browser tests cannot run in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless chromium (Debian's), driven by Playwright."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed (pip install -e '.[dev]')")
    if not Path(CHROMIUM).exists():
        _unavailable(f"{CHROMIUM} is missing (apt-get install chromium)")
    # Playwright's sync API runs an event loop in this thread; the ORM calls of the test
    # itself are synchronous and safe.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        yield browser
        browser.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    target = os.environ.get("JOBQUEUE_ADMIN_SCREENSHOTS")
    path = Path(target) if target else tmp_path
    path.mkdir(parents=True, exist_ok=True)
    return path


def real_jobs(start_worker: Any) -> dict[str, Any]:
    """Jobs as a worker leaves them: done, dead, a failed workflow, one running, one stuck."""
    # A long lease: a reclaimer judges others only once it has beaten for a whole TTL of its
    # own, so the stuck job below stays as it is for the whole tour, however slow the machine.
    worker = start_worker(
        "--concurrency", "4", "--queue", "default", "--lease-ttl", "600", *FAST
    )  # fmt: skip
    for account in range(1, 6):
        jobqueue.enqueue("reports.fetch", {"account_id": account})
    dead = jobqueue.enqueue("reports.build", {"account_id": 9, "failures": 5}, max_attempts=2)
    with jobqueue.container("nightly-reports") as box:
        fetches = [
            jobqueue.enqueue("reports.fetch", {"account_id": n}, parent=box) for n in (1, 2, 3)
        ]
        build = jobqueue.enqueue(
            "reports.build",
            {"account_id": 1, "failures": 1},
            parent=box,
            depends_on=fetches,
            max_attempts=1,
        )
        send = jobqueue.enqueue(
            "emails.send", {"to": "ops@example.com"}, parent=box, depends_on=[build]
        )
    # Until the tour cancels it: an hour, longer than any tour on a busy machine.
    running = jobqueue.enqueue("reports.export", {"limit": 3600})
    for n in range(3):  # the emails queue has no worker here: these wait, ready
        jobqueue.enqueue("emails.send", {"to": f"user{n}@example.com"}, queue="emails")
    wait_for_job(dead.pk, "dead")
    wait_for_job(box.pk, "dead")
    wait_for_job(running.pk, "running")
    poll(lambda: running.pk in (getattr(worker.row(), "job_ids", None) or []))  # its heartbeat
    # A worker that died holding a job: its row stale, the lease expired.
    now = timezone.now()
    gone = Worker.objects.create(
        id="web-2:31337:dead",
        host="web-2",
        pid=31337,
        queues=["default"],
        concurrency=2,
        started_at=now - dt.timedelta(hours=2),
        heartbeat_at=now - dt.timedelta(seconds=95),
        expires_at=now - dt.timedelta(seconds=65),
        lease_ttl=30,
        job_ids=[],
    )
    stuck = Job.objects.create(
        type="reports.export",
        args={"limit": 1},
        queue="reports",
        state="running",
        attempts=1,
        lease_owner=gone.pk,
        lease_expires=now - dt.timedelta(seconds=40),
        heartbeat_at=now - dt.timedelta(seconds=95),
        started_at=now - dt.timedelta(minutes=5),
    )
    return {
        "worker": worker,
        "dead": dead,
        "box": box,
        "build": build,
        "send": send,
        "running": running,
        "stuck": stuck,
    }


def test_operator_tour(browser: Any, live_server: Any, start_worker: Any, shots: Path) -> None:
    User.objects.create_superuser("ops", "ops@example.com", PASSWORD)
    jobs = real_jobs(start_worker)
    page = browser.new_page(viewport={"width": 1600, "height": 900})
    # Playwright's 30 s default is short for a page of a busy 2-core machine.
    page.set_default_timeout(120_000)
    page.set_default_navigation_timeout(120_000)
    base = live_server.url

    log_in(page, base, "ops", PASSWORD)
    for link in ("Overview", "Live leases", "Dead jobs", "Jobs", "Workers"):
        assert page.get_by_role("link", name=link, exact=True).count() >= 1, link
    page.screenshot(path=shots / "index.png")

    page.click("text=Overview")
    page.wait_for_selector("#jq-by-queue")  # the click's navigation has loaded the page
    assert "Job queue overview" in page.title()
    assert page.locator("#jq-by-queue").inner_text().count("emails") == 1
    assert "waiting" in page.locator("#jq-health").inner_text()  # the oldest ready job's age
    page.screenshot(path=shots / "overview.png", full_page=True)

    page.goto(base + url("job_changelist"))
    assert "RuntimeError: upstream API returned 502" in page.content()
    page.screenshot(path=shots / "jobs.png", full_page=True)

    page.goto(base + url("job_change", jobs["dead"].pk))
    page.locator(".jq-errors details").first.click()  # unfold a traceback
    text = page.locator("#content-main").inner_text()
    assert "upstream API returned 502 for account 9" in text and "Traceback" in text
    assert "not part of a workflow" not in text  # a job on its own: no empty workflow rows
    page.screenshot(path=shots / "job-top.png")
    page.locator("fieldset", has_text="Errors by attempt").screenshot(path=shots / "job-dead.png")

    page.goto(base + url("job_change", jobs["running"].pk))
    lease = page.locator("fieldset", has_text="Lease").last
    assert "pid" in lease.inner_text() and "EXPIRED" not in lease.inner_text()
    lease.screenshot(path=shots / "job-lease.png")

    page.goto(base + url("job_change", jobs["build"].pk))
    graph = page.locator("svg.jq-graph")
    assert graph.count() == 1
    assert graph.locator("a").count() == 3 + 1 + 1 + 1  # 3 upstream, itself, downstream, box
    page.locator("fieldset", has_text="Workflow").screenshot(path=shots / "job-workflow.png")
    graph.locator("a", has_text=f"#{jobs['send'].pk}").click()  # nodes are links
    page.wait_for_url(f"**{url('job_change', jobs['send'].pk)}")
    assert "cancelled because job" in page.locator("#content-main").inner_text()

    page.goto(base + url("livelease_changelist"))
    text = page.locator("#result_list").inner_text()
    assert "EXPIRED" in text and "(gone)" not in text and "(stale)" in text
    page.screenshot(path=shots / "leases.png", full_page=True)

    page.goto(base + url("worker_changelist"))
    assert "STALE" in page.locator("#result_list").inner_text()
    assert page.locator(f"#result_list a[href='{url('job_change', jobs['running'].pk)}']").count()
    page.screenshot(path=shots / "workers.png", full_page=True)

    # Retry the workflow's failed job: its downstream job revives, the container finishes.
    page.goto(base + url("deadjob_changelist"))
    page.screenshot(path=shots / "dead-jobs.png", full_page=True)
    page.check(f"input[name=_selected_action][value='{jobs['build'].pk}']")
    page.check(f"input[name=_selected_action][value='{jobs['box'].pk}']")
    page.select_option("select[name=action]", "retry_jobs")
    page.fill("input[name=extra_attempts]", "2")
    page.click("button[name=index]")
    message = page.locator("ul.messagelist").inner_text()
    assert f"Retried 1 job (#{jobs['build'].pk} ready)" in message, message
    assert f"Skipped 1: #{jobs['box'].pk}: it is a container" in message, message
    page.screenshot(path=shots / "retried.png")
    wait_for_job(jobs["box"].pk, "done")
    page.goto(base + url("job_change", jobs["build"].pk))
    assert page.locator("svg.jq-graph a text", has_text="dead").count() == 0
    workflow = page.locator("fieldset", has_text="Workflow")
    workflow.screenshot(path=shots / "job-workflow-retried.png")

    # Cancel the running job from the live leases; release the stuck one.
    page.goto(base + url("livelease_changelist"))
    page.check(f"input[name=_selected_action][value='{jobs['running'].pk}']")
    page.select_option("select[name=action]", "cancel_jobs")
    page.click("button[name=index]")
    message = page.locator("ul.messagelist").inner_text()
    assert f"#{jobs['running'].pk} cancel requested" in message, message
    wait_for_job(jobs["running"].pk, "cancelled")
    # The stuck job's own page offers the actions that fit its state, as buttons.
    page.goto(base + url("job_change", jobs["stuck"].pk))
    page.screenshot(path=shots / "job-buttons.png")
    page.get_by_role("button", name="Release lease").click()
    page.wait_for_url(f"**{url('job_change', jobs['stuck'].pk)}")
    assert "Released 1 job" in page.locator("ul.messagelist").inner_text()
    poll(lambda: Job.objects.get(pk=jobs["stuck"].pk).state == "ready")
    page.goto(base + url("job_change", jobs["running"].pk))
    # Cancelled from this admin: the page names the operator, from the job's History.
    assert "cancelled by operator ops" in page.locator("#content-main").inner_text()
    page.close()
    assert jobs["worker"].stop() == 0


def test_the_browser_is_there_in_ci() -> None:
    """In CI, the pieces the browser tests need are installed (they fail, never skip)."""
    if os.environ.get("CI") != "true":
        pytest.skip("only CI insists on the browser")
    assert Path(CHROMIUM).exists() or shutil.which("chromium")
    import playwright  # noqa: F401


def test_state_colours_and_warnings_apply_under_a_strict_csp(
    browser: Any, live_server: Any
) -> None:
    """With style-src 'self' the browser refuses inline styles: the stylesheet still colours."""
    User.objects.create_superuser("ops", "ops@example.com", PASSWORD)
    scenario = support.build()
    page = browser.new_page()
    refused: list[str] = []
    page.on("console", lambda m: refused.append(m.text) if "Content Security" in m.text else None)

    def strict(route: Any) -> None:
        response = route.fetch()
        headers = {**response.headers, "content-security-policy": "style-src 'self'"}
        route.fulfill(response=response, headers=headers)

    page.route("**/admin/**", strict)
    base = live_server.url
    log_in(page, base, "ops", PASSWORD)

    def computed(selector: str, prop: str) -> str:
        return str(page.locator(selector).first.evaluate(f"e => getComputedStyle(e).{prop}"))

    page.goto(base + url("job_change", scenario.dead.pk))
    assert computed(".jq-state-dead", "backgroundColor") == "rgb(183, 28, 28)"
    page.goto(base + url("livelease_changelist"))
    assert computed(".jq-state-running", "backgroundColor") == "rgb(230, 81, 0)"
    assert computed(".jq-warn", "color") == "rgb(183, 28, 28)"
    page.goto(base + url("job_change", scenario.stuck.pk))
    assert computed(".jq-job-action button", "textTransform") == "uppercase"
    page.close()
    assert refused == []
