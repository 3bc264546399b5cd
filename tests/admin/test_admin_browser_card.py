"""A job page's summary card and the enqueue form in a real browser (Debian's chromium under
Playwright), at a desktop and a phone's width, with no console error on any page.

The card sits above the fold with its actions beside it (below it on a phone): retry with
extra attempts, cancel a running job through its confirmation, release a stuck lease; the
enqueue form shows bad input on the form and enqueues good input; "Run again" on a job page.
Screenshots go where tests/admin/test_admin_browser.py puts them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from django_jobqueue.models import Job
from tests.admin.test_admin_browser import PASSWORD, browser, shots  # noqa: F401  (fixtures)
from tests.support import admin_support as support
from tests.support.admin_support import url
from tests.support.browser_support import log_in, watch_problems

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(params=[1280, 400], ids=["desktop", "phone"])
def ops(
    request: Any,
    browser: Any,  # noqa: F811
    live_server: Any,
) -> Iterator[tuple[Any, str, int]]:
    """A logged-in operator's page at a desktop's, then a phone's width; no console error."""
    User.objects.create_superuser("ops", "ops@example.com", PASSWORD)
    width = request.param
    page = browser.new_page(viewport={"width": width, "height": 900})
    page.set_default_timeout(120_000)
    page.set_default_navigation_timeout(120_000)
    problems = watch_problems(page)
    log_in(page, live_server.url, "ops", PASSWORD)
    yield page, live_server.url, width
    page.close()
    assert problems == []


def message(page: Any) -> str:
    return str(page.locator("ul.messagelist").inner_text())


def test_the_card_and_its_actions(ops: Any, shots: Path) -> None:  # noqa: F811
    page, base, width = ops
    scenario = support.build()

    page.goto(base + url("job_change", scenario.dead.pk))
    summary = page.locator(".jq-card-summary")
    retry = page.locator("form.jq-do-retry_jobs")
    assert "3 of 3 (used up)" in summary.inner_text()
    assert "upstream API returned 502" in summary.inner_text()
    # Above the fold: the state and the retry button are on the first screen.
    assert page.locator(".jq-card-state").bounding_box()["y"] < 900
    if width == 1280:  # the actions beside the summary, on its right
        page.screenshot(path=shots / "job-card.png")
        assert retry.bounding_box()["x"] > summary.bounding_box()["x"] + 300
        assert retry.bounding_box()["y"] < 900
        page.screenshot(path=shots / "job-card.png")
    else:  # a phone: under it, and nothing wider than the screen
        assert retry.bounding_box()["y"] > summary.bounding_box()["y"]
        assert page.evaluate("document.documentElement.scrollWidth") <= width + 1
    assert "Attempts are never reset" in retry.inner_text()
    retry.locator("input[name=extra_attempts]").fill("2")
    retry.locator("button").click()
    assert f"Retried 1 job (#{scenario.dead.pk} ready)" in message(page)
    dead = Job.objects.get(pk=scenario.dead.pk)
    assert (dead.state, dead.attempts, dead.max_attempts) == ("ready", 3, 5)

    # A running job's cancel asks first: the button shows only once the operator opens it.
    page.goto(base + url("job_change", scenario.running.pk))
    # Its live bar stands above the page's content, not against the navigation.
    toggle = page.locator(".jq-live-toggle").bounding_box()
    assert toggle["x"] >= page.locator(".jq-card").bounding_box()["x"] - 1
    assert "its lease expires in" in page.locator(".jq-card-worker").inner_text()
    page.screenshot(path=shots / f"job-card-running-{width}.png")
    cancel = page.locator("form.jq-do-cancel_jobs")
    assert not cancel.locator("button").is_visible()
    cancel.locator("summary").click()
    assert "its handler is asked to stop" in cancel.inner_text()
    cancel.locator("button").click()
    assert f"#{scenario.running.pk} cancel requested" in message(page)
    assert Job.objects.get(pk=scenario.running.pk).cancel_requested

    # A stuck lease (its worker gone) is released from the card.
    page.goto(base + url("job_change", scenario.stuck.pk))
    release = page.locator("form.jq-do-release_leases")
    assert "as the reclaim of an expired lease puts it" in release.inner_text()
    release.locator("button").click()
    assert "Released 1 job" in message(page)
    assert Job.objects.get(pk=scenario.stuck.pk).state == "ready"


def test_enqueue_from_the_admin_and_run_again(ops: Any, shots: Path) -> None:  # noqa: F811
    page, base, width = ops

    page.goto(base + url("job_changelist"))
    page.get_by_role("link", name="Enqueue a job").click()
    page.wait_for_selector("#jq-enqueue-form")
    page.select_option("select[name=handler]", "emails.send")
    page.fill("textarea[name=args]", '{"to": oops}')
    page.fill("input[name=uses]", "")
    page.click("#jq-enqueue-form input[type=submit]")
    errors = page.locator(".field-args .errorlist").inner_text()
    assert "The arguments is not JSON" in errors
    assert not Job.objects.exists()
    if width == 1280:
        page.screenshot(path=shots / "enqueue-error.png", full_page=True)
    else:
        assert page.evaluate("document.documentElement.scrollWidth") <= width + 1
    page.fill("textarea[name=args]", '{"to": "ops@example.com"}')
    page.fill("input[name=queue]", "emails")
    page.click("#jq-enqueue-form input[type=submit]")
    page.wait_for_selector(".jq-card")
    job = Job.objects.get()
    assert f"Enqueued job #{job.pk} (emails.send): it is ready." in message(page)
    assert (job.args, job.queue) == ({"to": "ops@example.com"}, "emails")

    page.locator("form.jq-run-again button").click()
    page.wait_for_selector(".jq-card")
    again = Job.objects.exclude(pk=job.pk).get()
    assert f"Enqueued job #{again.pk} with the arguments of job #{job.pk}" in message(page)
    assert (again.args, again.queue) == (job.args, job.queue)
