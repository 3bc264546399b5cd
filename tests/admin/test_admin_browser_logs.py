"""A job's log lines on its admin page, in a real browser (Playwright, Debian's chromium): one
fold per attempt, the newest open, markup shown as text, at a desktop and a narrow width,
under a strict Content-Security-Policy, with no console error."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

import django_jobqueue as jobqueue
from django_jobqueue.testing import run_jobs
from tests.admin.test_admin_browser import PASSWORD, browser  # noqa: F401 - the browser fixture
from tests.support.admin_support import url
from tests.support.browser_support import log_in, watch_problems

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]


@pytest.mark.parametrize("width", [1280, 390])
def test_the_job_page_shows_each_attempts_lines_escaped(
    browser: Any,  # noqa: F811 - the fixture imported above
    live_server: Any,
    width: int,
) -> None:
    User.objects.create_superuser("ops", "ops@example.com", PASSWORD)
    job = jobqueue.enqueue("logs.retried", {"fail_until": 1}, max_attempts=2)
    run_jobs()
    page = browser.new_page(viewport={"width": width, "height": 900})
    page.set_default_timeout(120_000)
    page.set_default_navigation_timeout(120_000)

    def strict(route: Any) -> None:
        response = route.fetch()
        headers = {**response.headers, "content-security-policy": "style-src 'self'"}
        route.fulfill(response=response, headers=headers)

    page.route("**/admin/**", strict)
    problems = watch_problems(page)
    base = live_server.url
    log_in(page, base, "ops", PASSWORD)
    page.goto(base + url("job_change", job.pk))
    section = page.locator("#jq-log")
    assert section.is_visible()
    folds = section.locator("details.jq-log-attempt")
    assert folds.count() == 2
    newest, first = folds.nth(0), folds.nth(1)
    assert newest.locator("summary").inner_text() == "attempt 2 · 3 lines"
    assert newest.get_attribute("open") is not None and first.get_attribute("open") is None
    assert "markup: <script>alert('x')</script> & more" in newest.inner_text()
    assert section.locator("script").count() == 0  # shown as text, never markup
    assert not first.locator("table").is_visible()
    first.locator("summary").click()
    assert first.locator("table").is_visible()
    assert "ValueError: boom on attempt 1" in first.inner_text()
    error_cell = first.locator("tr.jq-log-error td").first
    assert error_cell.evaluate("e => getComputedStyle(e).color") == "rgb(186, 33, 33)"
    # The lines fit the page: no sideways scrolling of the whole document.
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
    page.close()
    assert problems == []
