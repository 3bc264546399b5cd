"""The Schedules page in a real browser: a stored schedule added, paused, resumed, run now,
changed and deleted through the page's buttons and forms, at a desktop and a narrow width,
with no console error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from django_jobqueue.models import Job, ScheduleDefinition, ScheduleState
from tests.admin.test_admin_browser import PASSWORD, browser, shots  # noqa: F401 (fixtures)
from tests.support.admin_support import url
from tests.support.browser_support import log_in, wait_for_add_form, watch_problems

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]


@pytest.mark.parametrize("width", [1600, 390], ids=["desktop", "narrow"])
def test_a_stored_schedule_through_the_page(
    browser: Any,  # noqa: F811
    live_server: Any,
    shots: Path,  # noqa: F811
    settings: Any,
    width: int,
) -> None:
    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "SCHEDULES": {"nightly": {"handler": "test.noop", "cron": "0 3 * * *"}},
    }
    User.objects.create_superuser("ops", "ops@example.com", PASSWORD)
    page = browser.new_page(viewport={"width": width, "height": 900})
    page.set_default_timeout(120_000)
    problems = watch_problems(page)
    base = live_server.url
    log_in(page, base, "ops", PASSWORD)

    page.goto(base + url("schedulestate_changelist"))
    page.click("#jq-schedule-add")
    wait_for_add_form(page)
    page.fill("#id_name", "poll-feeds")
    page.fill("#id_handler", "test.add")
    page.fill("#id_every", "0")  # refused, as in the settings
    page.fill("#id_args", '{"a": 1, "b": 2}')
    page.click("input[name=_save]")
    assert "'every' must be a whole number" in page.locator("#content-main").inner_text()
    wait_for_add_form(page)  # the form again, its first field focused again
    page.fill("#id_every", "30")
    page.click("input[name=_save]")
    page.wait_for_url(f"**{url('schedulestate_changelist')}")
    row = page.locator("#jq-schedules tr", has_text="poll-feeds")
    assert "stored" in row.inner_text()
    assert any(t.startswith("in ") for t in row.locator(".jq-rel").all_inner_texts())  # "in 20 s"
    assert "settings" in page.locator("#jq-schedules tr", has_text="nightly").inner_text()

    row.get_by_role("button", name="Pause").click()
    assert "Paused schedule 'poll-feeds'" in page.locator("ul.messagelist").inner_text()
    assert ScheduleState.objects.get(name="poll-feeds").paused
    row = page.locator("#jq-schedules tr", has_text="poll-feeds")
    assert "paused" in row.inner_text()
    row.get_by_role("button", name="Run now").click()
    assert "Enqueued job #" in page.locator("ul.messagelist").inner_text()
    job = Job.objects.get()
    assert (job.type, job.args) == ("test.add", {"a": 1, "b": 2})
    row = page.locator("#jq-schedules tr", has_text="poll-feeds")
    assert f"#{job.pk}" in row.inner_text()  # its last outcome, linked
    row.get_by_role("button", name="Resume").click()
    assert not ScheduleState.objects.get(name="poll-feeds").paused
    page.screenshot(path=shots / f"schedules-{width}.png", full_page=True)

    page.locator("#jq-schedules tr", has_text="poll-feeds").get_by_role("link", name="edit").click()
    page.fill("#id_every", "60")
    page.click("input[name=_save]")
    page.wait_for_url(f"**{url('schedulestate_changelist')}")
    assert ScheduleDefinition.objects.get(name="poll-feeds").every == 60
    page.goto(base + url("scheduledefinition_delete", "poll-feeds"))
    page.click("input[type=submit]")
    page.wait_for_url(f"**{url('schedulestate_changelist')}")
    assert not ScheduleDefinition.objects.exists()
    assert "poll-feeds" not in page.locator("#jq-schedules").inner_text()
    page.close()
    assert problems == []
