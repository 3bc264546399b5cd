"""The admin review's list: times to the second with the full time on hover, errors with
their lines, date filters, "dead in the last hour" as a link, no Retry that would be refused."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.test import Client
from django.utils import timezone

from django_jobqueue.admin.filters import first_id_since
from django_jobqueue.models import Job
from tests.support.admin_support import Scenario, url
from tests.support.factories import JobFactory

pytestmark = pytest.mark.django_db


def ids_listed(html: str) -> set[int]:
    return {int(pk) for pk in re.findall(r'name="_selected_action" value="(\d+)"', html)}


def test_times_show_seconds_and_the_full_time_on_hover(
    admin_client: Client, scenario: Scenario
) -> None:
    html = admin_client.get(url("job_changelist")).content.decode()
    shown = re.findall(r'<time datetime="([^"]+)" title="([^"]+)">([^<]+)</time>', html)
    assert shown, "no <time> in the list"
    for iso, full, text in shown:
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", text), text
        assert "UTC" in full and dt.datetime.fromisoformat(iso)
    page = admin_client.get(url("job_change", scenario.dead.pk)).content.decode()
    assert page.count("<time ") >= 3  # created, updated, finished


def test_an_error_keeps_its_lines(admin_client: Client, scenario: Scenario) -> None:
    html = admin_client.get(url("job_change", scenario.dead.pk)).content.decode()
    assert '<pre class="jq-message">upstream API returned 502\nsecond line</pre>' in html


def test_jobs_filter_by_when_they_were_created_and_finished(admin_client: Client) -> None:
    now = timezone.now()
    old = JobFactory(state=Job.State.DEAD, attempts=1, finished_at=now - dt.timedelta(days=40))
    week = JobFactory(state=Job.State.DEAD, attempts=1, finished_at=now - dt.timedelta(days=3))
    recent = JobFactory(state=Job.State.DEAD, attempts=1, finished_at=now - dt.timedelta(minutes=5))
    ready = JobFactory()
    # created_at as if each was enqueued at its time, in id order
    ages = {old: 40 * 24 * 60, week: 3 * 24 * 60, recent: 10, ready: 1}  # minutes
    for job, minutes in ages.items():
        Job.objects.filter(pk=job.pk).update(created_at=now - dt.timedelta(minutes=minutes))
    page = url("job_changelist")
    assert ids_listed(admin_client.get(page + "?finished=1h").content.decode()) == {recent.pk}
    assert ids_listed(admin_client.get(page + "?finished=7d").content.decode()) == {
        recent.pk, week.pk
    }  # fmt: skip
    assert ids_listed(admin_client.get(page + "?finished=older").content.decode()) == {old.pk}
    assert ids_listed(admin_client.get(page + "?created=1h").content.decode()) == {
        recent.pk, ready.pk
    }  # fmt: skip
    assert ids_listed(admin_client.get(page + "?created=older").content.decode()) == {old.pk}
    dead = url("deadjob_changelist")
    assert ids_listed(admin_client.get(dead + "?finished=24h").content.decode()) == {recent.pk}


def test_the_first_id_since_a_moment_is_found_by_a_bounded_search() -> None:
    now = timezone.now()
    jobs = [JobFactory() for _ in range(40)]
    for n, job in enumerate(jobs):
        Job.objects.filter(pk=job.pk).update(created_at=now - dt.timedelta(minutes=40 - n))
    assert first_id_since(Job.objects.all(), now - dt.timedelta(minutes=15, seconds=30)) == (
        jobs[25].pk
    )
    assert first_id_since(Job.objects.all(), now + dt.timedelta(minutes=1)) is None
    assert first_id_since(Job.objects.all(), now - dt.timedelta(days=1)) == jobs[0].pk


def test_dead_in_the_last_hour_links_to_those_jobs(
    admin_client: Client, scenario: Scenario
) -> None:
    html = admin_client.get(url("queueoverview_changelist")).content.decode()
    link = re.search(r'Dead in the last hour</th>\s*<td[^>]*><a href="([^"]+)"', html)
    assert link, html
    listed = ids_listed(admin_client.get(link.group(1).replace("&amp;", "&")).content.decode())
    assert listed == {scenario.dead.pk, scenario.container.pk, scenario.child_dead.pk}


def test_no_retry_is_offered_where_it_would_be_refused(
    admin_client: Client, scenario: Scenario
) -> None:
    # scenario.downstream is cancelled because child_dead is dead: retry() refuses it.
    html = admin_client.get(url("job_change", scenario.downstream.pk)).content.decode()
    assert 'value="retry_jobs"' not in html
    assert "retrying that job revives this one" in html
    html = admin_client.get(url("job_change", scenario.child_dead.pk)).content.decode()
    assert 'value="retry_jobs"' in html


def test_no_retry_is_offered_while_another_job_holds_the_unique_key(
    admin_client: Client,
) -> None:
    import django_jobqueue as jobqueue

    dead = jobqueue.enqueue("test.noop", unique_key="uk-1")
    Job.objects.filter(pk=dead.pk).update(
        state=Job.State.DEAD, attempts=1, finished_at=timezone.now(), unique_slot=None
    )
    page = url("job_change", dead.pk)
    assert 'value="retry_jobs"' in admin_client.get(page).content.decode()
    holder = jobqueue.enqueue("test.noop", unique_key="uk-1")  # the key is free again
    html = admin_client.get(page).content.decode()
    assert 'value="retry_jobs"' not in html and "retry-from-step" not in html
    assert f"{url('job_change', holder.pk)}" in html and "holds its unique key now" in html
