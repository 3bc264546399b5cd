"""Pause a resource from the Limits page and a workflow from its job page, in a real browser
(Debian's chromium under Playwright), at a phone's width and a desktop's, with no console
error: the buttons work, and the jobs list, the job page and the Limits page mark the pause."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

import django_jobqueue as jobqueue
from django_jobqueue import pausing
from tests.admin.test_admin_browser import PASSWORD, browser  # noqa: F401  (fixture)
from tests.support.admin_support import url
from tests.support.browser_support import log_in, watch_problems

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]

LIMITS = {"openai": {"concurrency": 4}, "tenant:*": {"concurrency": 1}}


def test_pause_and_resume_a_resource_and_a_workflow_in_the_browser(
    browser: Any,  # noqa: F811
    live_server: Any,
    settings: Any,
) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "LIMITS": LIMITS}
    User.objects.create_superuser("ops", "ops@example.com", PASSWORD)
    tenant_job = jobqueue.enqueue("test.noop", uses={"tenant:42": 1})
    with jobqueue.container("nightly") as box:
        child = jobqueue.enqueue("test.noop", parent=box)
    base = live_server.url

    for width in (400, 1280):  # a phone, then a desktop
        page = browser.new_page(viewport={"width": width, "height": 900})
        problems = watch_problems(page)
        log_in(page, base, "ops", PASSWORD)

        page.goto(base + url("limit_changelist"))
        form = page.locator("form#jq-resource-pause")
        assert form.locator("input[name=name]").is_visible() and form.locator("button").is_visible()
        form.locator("input[name=name]").fill("tenant:*")
        form.locator("button").click()
        assert "Paused resources matching 'tenant:*'" in page.locator("ul.messagelist").inner_text()
        row = page.locator("#jq-limits tr", has_text="tenant:42")
        assert "paused (tenant:*)" in row.inner_text()
        assert "tenant:*" in page.locator("#jq-paused-resources").inner_text()

        page.goto(base + url("job_changelist"))
        listed = page.locator("#result_list tr", has_text=f"#{tenant_job.pk}")
        assert "paused: resource 'tenant:*' is paused" in listed.inner_text()

        page.goto(base + url("job_change", box.pk))
        page.locator("form.jq-pause-workflow button").click()
        assert f"Paused workflow #{box.pk}" in page.locator("ul.messagelist").inner_text()
        assert page.locator("form.jq-resume-workflow").count() == 1
        page.goto(base + url("job_change", child.pk))
        assert "paused: its workflow is paused" in page.locator("#content").inner_text()

        page.goto(base + url("job_change", box.pk))
        page.locator("form.jq-resume-workflow button").click()
        assert f"Resumed workflow #{box.pk}." in page.locator("ul.messagelist").inner_text()
        page.goto(base + url("limit_changelist"))
        page.locator("#jq-paused-resources form button").click()
        assert "Resumed resources matching 'tenant:*'." in (
            page.locator("ul.messagelist").inner_text()
        )
        assert "No resource is paused." in page.locator("#jq-paused-resources").inner_text()
        page.close()
        assert problems == []
    assert pausing.paused_resources() == () and pausing.paused_workflows() == ()
