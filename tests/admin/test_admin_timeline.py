"""A workflow's timeline on its container's page: a bar per child, split by attempt and by
suspension, the critical path outlined, and a 2,000-child workflow collapsed to a page."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_jobqueue.admin import timeline
from django_jobqueue.models import Job, JobDependency, JobStep
from tests.support.admin_support import url
from tests.support.factories import JobFactory

pytestmark = pytest.mark.django_db


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


T0 = timezone.now() - dt.timedelta(hours=1)


def child(container: Job, start: float, end: float | None, **fields) -> Job:
    fields.setdefault("state", Job.State.DONE if end is not None else Job.State.RUNNING)
    return JobFactory(
        parent=container,
        type=fields.pop("type", "reports.fetch"),
        first_started_at=at(start),
        started_at=at(fields.pop("last_start", start)),
        finished_at=at(end) if end is not None else None,
        attempts=1,
        **fields,
    )


def test_bars_attempts_pauses_and_the_critical_path(admin_client: Client) -> None:
    box = JobFactory(type="workflow.nightly", is_container=True, state=Job.State.WAITING)
    retried = child(box, 0, 40, last_start=30, errors=[{"type": "E", "message": "m"}])
    after = child(box, 41, 1000, type="reports.build")
    JobDependency.objects.create(job=after, depends_on=retried)
    short = child(box, 5, 10)
    sleeper = child(box, 2, 700, last_start=609)  # slept 600 s, then ran again
    step = JobStep.objects.create(
        job=sleeper, name="@sleep", seq=1, attempt=1, result={"seconds": 600}
    )
    JobStep.objects.filter(pk=step.pk).update(created_at=at(8))
    JobFactory(parent=box)  # not started: no bar

    html = admin_client.get(url("job_change", box.pk)).content.decode()
    [svg] = re.findall(r'<svg class="jq-timeline".*?</svg>', html, re.S)
    for job in (retried, after, short, sleeper):
        assert url("job_change", job.pk) in svg
    assert svg.count('class="jq-attempt"') == 4
    assert svg.count('class="jq-earlier"') == 2  # the retried job's, the sleeper's first run
    assert svg.count('class="jq-pause"') == 1  # the sleep, until the time it asked for
    stamp = timezone.localtime(at(608)).strftime("%H:%M:%S")
    assert f"sleep from {timezone.localtime(at(8)).strftime('%H:%M:%S')} to {stamp}" in svg
    assert svg.count('class="jq-critical"') == 2  # the build and the fetch it waited on
    assert "1 failed attempt(s)" in svg
    assert "critical path outlined" in html

    # A child's page has no timeline row; a job on its own has no workflow section rows.
    assert (
        'class="jq-timeline"' not in admin_client.get(url("job_change", short.pk)).content.decode()
    )


def test_a_workflow_of_2000_children_collapses_and_reads_little(admin_client: Client) -> None:
    box = JobFactory(type="workflow.big", is_container=True, state=Job.State.WAITING)
    Job.objects.bulk_create(
        [
            Job(
                type=f"kind.{n % 3}",
                parent=box,
                state=Job.State.DONE,
                attempts=1,
                first_started_at=at(n),
                started_at=at(n),
                finished_at=at(n + 30),
                args={},
            )
            for n in range(2000)
        ]
    )
    dead = Job.objects.filter(parent=box, type="kind.1").order_by("pk").first()
    Job.objects.filter(pk=dead.pk).update(
        state=Job.State.DEAD, errors=[{"type": "E", "message": "m"}]
    )
    with CaptureQueriesContext(connection) as queries:
        svg = str(timeline.render(box))
    assert len(queries.captured_queries) <= 4
    rows = svg.count('class="jq-attempt"')
    assert 1 <= rows <= timeline.ROWS
    more = [int(n) for n in re.findall(r"\+(\d+) more", svg)]
    assert rows + sum(more) == 2000
    assert svg.count('class="jq-critical"') >= 1
    assert "jq-state" not in svg  # no HTML badge inside the SVG
    page = admin_client.get(url("job_change", box.pk))
    assert page.status_code == 200
