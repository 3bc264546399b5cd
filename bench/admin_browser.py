"""The admin of a million jobs in a real browser: the proof behind the admin reference page.

`BENCH_DB=pg|mysql|sqlite python -m bench.admin_browser [--shots DIR]`, after
`bench.admin_scale` has filled its database (1,000,000 jobs, a 2,000-child workflow that ran,
a durable job that died after three steps, two days of figures).

Starts `runserver --insecure` and a `jobqueue_worker` (default queue) on that database, on
loopback, and drives Debian's chromium with Playwright through the new views and actions:
the overview's charts (hour and day), the live refresh and its pause, the workflow's timeline,
retry from a step, the Limits page, and "select all" over the 20,000 dead jobs, confirmed and
done by a queue job. It fails on any console error or failed load, and prints each page's load
time (navigation start to the load event, in the browser) and the bulk retry's duration.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.support.browser_support import log_in, watch_problems

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
PASSWORD = "bench-browser-pw"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.project.admin_settings"}
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "django", *args], cwd=ROOT, env=env, stdout=out, stderr=out
        )


def wait_until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out: {what}")
        time.sleep(0.2)


def main() -> None:
    from bench import harness

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shots", type=Path, help="save screenshots in this directory")
    opts = parser.parse_args()
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.project.admin_settings"
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.contrib.auth.models import User
    from playwright.sync_api import sync_playwright

    from django_jobqueue.models import Job, JobStep

    # Playwright's sync API runs an event loop in this thread; the ORM calls here are plain
    # synchronous reads between the browser's steps.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    rows = Job.objects.count()
    assert rows >= 1_000_000, f"{rows} jobs: run bench.admin_scale first"
    box = Job.objects.filter(is_container=True).values_list("pk", flat=True)[0]
    durable = Job.objects.filter(has_steps=True, state="dead").values_list("pk", flat=True)[0]
    dead = Job.objects.filter(state="dead").count()
    User.objects.filter(username="ops").delete()
    User.objects.create_superuser("ops", "ops@example.com", PASSWORD)

    state = ROOT / ".bench-state"
    port = free_port()
    server = start(["runserver", f"127.0.0.1:{port}", "--noreload", "--insecure"],
                   state / "admin_browser-server.log")  # fmt: skip
    worker = start(["jobqueue_worker", "--queue", "default", "--concurrency", "2"],
                   state / "admin_browser-worker.log")  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    figures: dict[str, Any] = {"rows": rows}
    problems: list[str] = []
    try:
        wait_until(lambda: _answers(base), 60, "runserver")
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
            )
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(120_000)
            problems = watch_problems(page)

            def visit(name: str, path: str) -> None:
                page.goto(base + path)
                took = page.evaluate(
                    "() => { const t = performance.getEntriesByType('navigation')[0];"
                    " return t.loadEventEnd - t.startTime; }"
                )
                figures[f"{name} (ms)"] = round(float(took), 1)
                print(f"{name:40s} {took:8.1f} ms", flush=True)

            def shot(name: str, locator: Any = None) -> None:
                if opts.shots:
                    opts.shots.mkdir(parents=True, exist_ok=True)
                    target = locator if locator is not None else page
                    kwargs = {} if locator is not None else {"full_page": True}
                    target.screenshot(path=str(opts.shots / name), **kwargs)

            log_in(page, base, "ops", PASSWORD)

            admin = "/admin/django_jobqueue"
            visit("overview", f"{admin}/queueoverview/")
            assert page.locator("svg.jq-chart").count() == 4
            assert page.locator("svg.jq-chart polyline").count() >= 4
            page.wait_for_function(
                "() => document.querySelector('p.jq-live span').textContent.startsWith('Updated')"
            )
            page.click("button.jq-live-toggle")
            assert "Paused." in page.locator("p.jq-live").inner_text()
            shot("overview-charts.png")
            page.click("button.jq-live-toggle")
            visit("overview, last day", f"{admin}/queueoverview/?range=day")
            assert page.locator("svg.jq-chart polyline").count() >= 4

            visit("workflow of 2,000 children", f"{admin}/job/{box}/change/")
            timeline = page.locator("svg.jq-timeline")
            assert 1 <= timeline.locator("rect.jq-attempt").count() <= 60
            assert timeline.locator("text", has_text="more").count() >= 1
            shot("timeline.png", page.locator("fieldset", has_text="Workflow"))

            visit("jobs", f"{admin}/job/")
            shot("jobs.png")
            visit("jobs finished=1h", f"{admin}/job/?finished=1h")
            visit("live leases", f"{admin}/livelease/")
            visit("limits", f"{admin}/limit/")

            first = JobStep.objects.filter(job_id=durable).order_by("pk").first()
            assert first is not None
            visit("durable job", f"{admin}/job/{durable}/change/")
            page.select_option("form.jq-retry-step select[name=step]", str(first.pk))
            page.click("form.jq-retry-step button")
            assert "the steps after record" in page.locator("ul.messagelist").inner_text()
            assert JobStep.objects.filter(job_id=durable).count() == 1

            visit("dead jobs", f"{admin}/deadjob/?state=dead")
            page.check("#action-toggle")
            page.click(".actions .question a")
            page.select_option("select[name=action]", "retry_jobs")
            started = time.perf_counter()
            page.click("button[name=index]")
            figures["select all: confirmation (ms)"] = round(
                (time.perf_counter() - started) * 1000, 1
            )
            count = page.locator(".jq-bulk-count").inner_text()
            assert count == f"{dead - 1:,}", (count, dead)
            shot("bulk-confirm.png")
            page.click("input[type=submit][value^=Yes]")
            assert "matching jobs are handed to job" in page.locator("ul.messagelist").inner_text()
            bulk = Job.objects.get(type="jobqueue.admin_bulk_action")
            started = time.perf_counter()
            wait_until(
                lambda: Job.objects.filter(pk=bulk.pk, state__in=["done", "dead"]).exists(),
                1800,
                "the bulk retry",
            )
            figures["bulk retry seconds"] = round(time.perf_counter() - started, 1)
            bulk.refresh_from_db()
            assert bulk.state == "done", bulk.last_error
            figures["bulk retried"] = bulk.result["changed"]
            print(f"bulk retry of {bulk.result['changed']:,} dead jobs: "
                  f"{figures['bulk retry seconds']} s", flush=True)  # fmt: skip
            visit("bulk job page", f"{admin}/job/{bulk.pk}/change/")
            assert not Job.objects.filter(state="dead").exclude(pk=bulk.pk).exists()
            browser.close()
    finally:
        worker.terminate()
        server.terminate()
        worker.wait(60)
        server.wait(60)
    figures["console errors"] = len(problems)
    harness.report("admin_browser", figures)
    if problems:
        raise SystemExit("console errors or failed loads:\n" + "\n".join(problems))


def _answers(base: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(base + "/admin/login/", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


if __name__ == "__main__":
    main()
