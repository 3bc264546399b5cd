"""The operators' view of long work in a real browser (Debian's chromium under Playwright):
the overview's charts drawn from what a worker recorded, pages that refresh themselves and
pause, a workflow's timeline, a long job's progress, retry from a step, the Limits page, and
"select all" over more dead jobs than a request handles, confirmed and done by a queue job.

No console error on any page. Screenshots go where tests/admin/test_admin_browser.py puts them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

import django_jobqueue as jobqueue
from django_jobqueue.models import Job, JobStep, MinuteCount
from django_jobqueue.testing import run_jobs
from tests.admin.test_admin_browser import PASSWORD, browser, shots  # noqa: F401  (fixtures)
from tests.conftest import poll, wait_for_job
from tests.support.admin_support import url
from tests.support.browser_support import log_in, watch_problems
from tests.testapp.durable_jobs import lines

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]

DEAD = 1200  # more than one request handles (ACTION_LIMIT): the bulk retry goes to a job
LIMITS = {"openai": {"concurrency": 4, "rate": "60/m"}, "tenant:*": {"concurrency": 1}}


def recorded_work(start_worker: Any, marker: str) -> dict[str, Any]:
    """What a burst worker leaves: figures for the charts, a finished workflow, a durable job
    that died after two of its four steps."""
    for _ in range(30):
        jobqueue.enqueue("test.noop")
    durable = jobqueue.enqueue(
        "durable.loop_steps", {"marker": marker, "pages": 4, "fail_at": 2}, max_attempts=1
    )
    with jobqueue.container("nightly-reports") as box:
        first = [jobqueue.enqueue("test.noop", parent=box) for _ in range(3)]
        last = jobqueue.enqueue("test.noop", parent=box, depends_on=first)
    burst = start_worker("--burst", "--concurrency", "4")
    assert burst.wait() == 0, burst.output()
    assert wait_for_job(durable.pk, "dead").state == "dead"
    assert wait_for_job(box.pk, "done").state == "done"
    assert MinuteCount.objects.exists()
    now = timezone.now()
    Job.objects.bulk_create(
        [
            Job(
                type="test.noop",
                queue="bulk",  # no worker serves it: retried jobs wait, ready
                state=Job.State.DEAD,
                attempts=1,
                max_attempts=1,
                finished_at=now,
                args={},
                last_error={"type": "RuntimeError", "message": "upstream API down"},
            )
            for _ in range(DEAD)
        ]
    )
    return {"durable": durable, "box": box, "last": last}


def test_long_work_tour(
    browser: Any,  # noqa: F811
    shots: Path,  # noqa: F811
    live_server: Any,
    start_worker: Any,
    settings: Any,
    tmp_path: Path,
) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "LIMITS": LIMITS}
    User.objects.create_superuser("ops", "ops@example.com", PASSWORD)
    marker = str(tmp_path / "calls")
    jobs = recorded_work(start_worker, marker)
    worker = start_worker("--concurrency", "2", "--queue", "default", "--shutdown-timeout", "1")
    long = jobqueue.enqueue("durable.progressing", {"steps": 3600, "pause": 0.5})
    wait_for_job(long.pk, "running")

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(120_000)
    page.set_default_navigation_timeout(120_000)
    problems = watch_problems(page)
    base = live_server.url
    log_in(page, base, "ops", PASSWORD)

    # The overview: four charts with lines, refreshing every 5 s until paused.
    page.goto(base + url("queueoverview_changelist"))
    charts = page.locator("svg.jq-chart")
    assert charts.count() == 4
    assert page.locator("svg.jq-chart polyline, svg.jq-chart circle").count() >= 2
    live = page.locator("p.jq-live")
    page.wait_for_function(
        "() => document.querySelector('p.jq-live span').textContent.startsWith('Updated')"
    )
    assert page.locator("svg.jq-chart").count() == 4  # still there after the refresh
    page.click("button.jq-live-toggle")
    assert "Paused." in live.inner_text()
    page.reload()
    assert "Paused." in page.locator("p.jq-live").inner_text()  # kept for the tab
    page.screenshot(path=shots / "overview-charts.png", full_page=True)
    page.click("button.jq-live-toggle")
    assert "Live" in page.locator("p.jq-live").inner_text()
    page.goto(base + url("queueoverview_changelist") + "?range=day")
    assert "Jobs per 10 minutes" in page.locator("#content-main").inner_text()

    # At 1,280 px, with the admin's navigation open, the lists fit the page: no sideways
    # scrolling (the filters go above them).
    for listing in ("job_changelist", "livelease_changelist", "deadjob_changelist"):
        page.goto(base + url(listing))
        widths = page.evaluate(
            "() => { const t = document.querySelector('#result_list');"
            " return [t.scrollWidth, t.closest('.results').clientWidth]; }"
        )
        assert widths[0] <= widths[1], (listing, widths)
    page.goto(base + url("job_changelist"))
    page.screenshot(path=shots / "jobs-1280.png")
    # The jobs list refreshes itself as the live leases do.
    page.wait_for_function(
        "() => document.querySelector('p.jq-live span').textContent.startsWith('Updated')"
    )
    assert page.locator("#result_list progress").count() == 1  # the running job only

    # Live leases and the long job's page refresh themselves; its progress moves.
    page.goto(base + url("livelease_changelist"))
    assert page.locator("#result_list progress").count() == 1
    page.wait_for_function(
        "() => document.querySelector('p.jq-live span').textContent.startsWith('Updated')"
    )
    # The refreshed list keeps Django's selection behaviour (the toggle, the counter).
    page.check("#action-toggle")
    assert "1 of 1 selected" in page.locator(".action-counter").inner_text()
    page.goto(base + url("job_change", long.pk))
    before = page.locator("fieldset", has_text="Long job").inner_text()
    page.wait_for_function(
        "() => document.querySelector('p.jq-live span').textContent.startsWith('Updated')"
    )
    poll(lambda: page.locator("fieldset", has_text="Long job").inner_text() != before, 60)
    page.locator("fieldset", has_text="Long job").screenshot(path=shots / "long-job.png")

    # The workflow's timeline: a bar per child, the critical path outlined.
    page.goto(base + url("job_change", jobs["box"].pk))
    timeline = page.locator("svg.jq-timeline")
    assert timeline.locator("rect.jq-attempt").count() == 4
    assert timeline.locator("rect.jq-critical").count() >= 2  # the last child and one before
    timeline.locator("a text", has_text=f"#{jobs['last'].pk}").click()  # rows are links
    page.wait_for_url(f"**{url('job_change', jobs['last'].pk)}")
    page.go_back()
    page.locator("fieldset", has_text="Workflow").screenshot(path=shots / "timeline.png")

    # Retry the durable job from its first step: the second runs again, the first does not.
    durable = jobs["durable"]
    first = JobStep.objects.filter(job=durable).order_by("pk").first()
    page.goto(base + url("job_change", durable.pk))
    page.select_option("form.jq-retry-step select[name=step]", str(first.pk))
    page.click("form.jq-retry-step button")
    assert "the steps after record" in page.locator("ul.messagelist").inner_text()
    assert wait_for_job(durable.pk, "done").state == "done"
    assert lines(marker) == ["page0", "page1", "page1", "page2", "page3"]

    # The Limits page.
    page.goto(base + url("limit_changelist"))
    text = page.locator("#content-main").inner_text()
    assert "openai" in text and "tenant:*" in text and "bulk" in text  # the queues table too
    page.screenshot(path=shots / "limits.png", full_page=True)

    # Select all 1,200 dead jobs of the queue, confirm, and let a queue job retry them.
    page.goto(base + url("deadjob_changelist") + "?queue=bulk")
    page.check("#action-toggle")
    page.click(".actions .question a")
    page.select_option("select[name=action]", "retry_jobs")
    page.click("button[name=index]")
    assert page.locator(".jq-bulk-count").inner_text() == f"{DEAD:,}"
    page.screenshot(path=shots / "bulk-confirm.png")
    assert Job.objects.filter(queue="bulk", state="dead").count() == DEAD  # not yet
    page.click("input[type=submit][value^=Yes]")
    message = page.locator("ul.messagelist").inner_text()
    assert f"{DEAD:,} matching jobs are handed to job" in message, message
    bulk = Job.objects.get(type="jobqueue.admin_bulk_action")
    assert wait_for_job(bulk.pk, "done", "dead", timeout=300).state == "done"
    assert Job.objects.filter(queue="bulk", state="ready").count() == DEAD
    page.goto(base + url("job_change", bulk.pk))
    assert f"Retried {DEAD:,}" in page.locator("fieldset", has_text="Long job").inner_text()

    page.close()
    assert problems == []
    assert worker.stop() == 0


def test_send_event_and_run_now_from_a_job_page(
    browser: Any,  # noqa: F811
    live_server: Any,
) -> None:
    User.objects.create_superuser("ops", "ops@example.com", PASSWORD)
    waiting = jobqueue.enqueue("durable.waiter", {"key": "approval:1"}, max_attempts=1)
    later = jobqueue.enqueue("durable.sleeper", {"seconds": 3600})
    run_jobs(ignore_delays=False)
    assert Job.objects.get(pk=waiting.pk).state == Job.State.WAITING
    assert Job.objects.get(pk=later.pk).state == Job.State.SCHEDULED

    for width in (400, 1280):  # a phone, then a desktop: the form is usable on both
        page = browser.new_page(viewport={"width": width, "height": 900})
        problems = watch_problems(page)
        log_in(page, live_server.url, "ops", PASSWORD)
        page.goto(live_server.url + url("job_change", waiting.pk))
        form = page.locator("form.jq-send-event")
        assert "approval:1" in form.inner_text()
        assert page.locator("form.jq-run-now").count() == 0
        if width == 400:
            assert form.locator("textarea").is_visible() and form.locator("button").is_visible()
            page.close()
            assert problems == []
            continue
        form.locator("textarea").fill("{oops")
        form.locator("button").click()
        assert "the payload is not JSON" in page.locator("ul.messagelist").inner_text()
        assert Job.objects.get(pk=waiting.pk).state == Job.State.WAITING
        page.locator("form.jq-send-event textarea").fill('{"approved": true}')
        page.locator("form.jq-send-event button").click()
        assert "Sent event 'approval:1'" in page.locator("ul.messagelist").inner_text()
        assert page.locator("form.jq-send-event").count() == 0  # it waits no more

        page.goto(live_server.url + url("job_change", later.pk))
        page.locator("form.jq-run-now button").click()
        assert "is due now: it is ready" in page.locator("ul.messagelist").inner_text()
        page.close()
        assert problems == []
    run_jobs(ignore_delays=False)
    assert Job.objects.get(pk=waiting.pk).result == {"payload": {"approved": True}}
    assert Job.objects.get(pk=later.pk).state == Job.State.DONE
