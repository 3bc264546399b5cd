"""The admin under a strict Content-Security-Policy: no inline style anywhere, one stylesheet."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.test import Client

import django_jobqueue
from django_jobqueue.admin import display
from django_jobqueue.models import Job
from tests.support import admin_support as support
from tests.support.admin_support import Scenario, url
from tests.support.factories import JobFactory

pytestmark = pytest.mark.django_db

INLINE_STYLE = re.compile(r"<[^>]*\sstyle\s*=", re.IGNORECASE)
STYLE_ELEMENT = re.compile(r"<style[\s>]", re.IGNORECASE)
STYLESHEET = Path(django_jobqueue.__file__).parent / "static" / display.STYLESHEET


def pages(s: Scenario) -> list[str]:
    """Every page the admin tests visit: lists filtered and searched, jobs, history, errors."""
    big = JobFactory(is_container=True, state=Job.State.WAITING)
    for _ in range(10):  # more children than the picture shows: the "+N more" node
        JobFactory(parent=big)
    jobs = url("job_changelist")
    return [
        *support.every_page(s),
        url("job_change", big.pk),
        url("job_history", s.dead.pk),
        url("worker_change", s.stale_worker.pk),
        jobs + "?state=dead",
        jobs + f"?container={s.container.pk}",
        jobs + f"?upstream_of={s.downstream.pk}",
        jobs + f"?worker={s.live_worker.pk}",
        jobs + "?has_error=yes&queue=default",
        jobs + "?q=fetch-7",
        jobs + "?e=1",
        url("livelease_changelist") + f"?worker={s.stale_worker.pk}",
        url("deadjob_changelist") + "?state=dead",
        url("job_enqueue"),
        url("job_enqueue") + f"?from={s.dead.pk}",
        "/admin/",
    ]


def test_no_page_carries_an_inline_style(admin_client: Client) -> None:
    scenario = support.build()
    for page in pages(scenario):
        response = admin_client.get(page)
        assert response.status_code == 200, page
        html = response.content.decode()
        assert not INLINE_STYLE.search(html), (page, INLINE_STYLE.search(html))
        assert not STYLE_ELEMENT.search(html), page
        if "/django_jobqueue/" in page and "/history/" not in page:
            assert f'href="/static/{display.STYLESHEET}"' in html, page


def test_nor_does_a_page_after_an_action(admin_client: Client) -> None:
    """The messages an action leaves, and the actions bar with its attempts box."""
    scenario = support.build()
    data = {"action": "retry_jobs", "index": "0", "_selected_action": [str(scenario.dead.pk)]}
    response = admin_client.post(url("deadjob_changelist"), data, follow=True)
    html = response.content.decode()
    assert "Retried 1 job" in html and 'name="extra_attempts"' in html
    assert not INLINE_STYLE.search(html) and not STYLE_ELEMENT.search(html)


def test_the_stylesheet_colours_every_state_as_the_picture_does() -> None:
    css = STYLESHEET.read_text()
    for state, colour in display.STATE_COLOURS.items():
        assert re.search(rf"\.jq-state-{state} {{ background: {colour}; }}", css), state
    assert {str(s) for s in display.STATE_COLOURS} == set(Job.State.values)
    assert ".jq-warn {" in css
