"""Handler versions in one process: registration, the version a job's first claim gives it,
which jobs a claim may take, and what stats and the admin show of them. (Real worker
processes of several releases: tests/deploys/test_versions_workers.py.)"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone

import django_jobqueue as jobqueue
from django_jobqueue import checks, registry, versions
from django_jobqueue.exceptions import HandlerRegistrationError, UnknownHandlerError
from django_jobqueue.models import Job, Worker
from django_jobqueue.testing import run_jobs

KEY = "scratch.report"

Register = Callable[..., None]


@pytest.fixture
def register() -> Iterator[Register]:
    """Register `func` as `version` of KEY (or of `key`); forgotten after the test."""
    keys: set[str] = set()

    def add(version: str, func: Callable[..., Any] | None = None, key: str = KEY) -> None:
        keys.add(key)

        def run(ctx: jobqueue.JobContext) -> str:
            return f"ran {version or 'unversioned'}"

        run.__qualname__ = f"run_{version}"  # another function for each version
        jobqueue.handler(key, takes_context=True, version=version)(func or run)

    yield add
    for key in keys:
        registry.unregister(key)


def started(type: str = KEY, version: str = "", **extra: Any) -> Job:
    """A ready job that a run started before (under `version`): it slept, say."""
    return Job.objects.create(
        type=type, handler_version=version, first_started_at=timezone.now(), **extra
    )


# -- registration --------------------------------------------------------------------------------


def test_versions_of_a_key_live_side_by_side_and_the_last_registered_is_the_newest(register):
    register("1")
    register("2")
    assert registry.versions(KEY) == ("1", "2")
    assert registry.get(KEY).version == "2"
    assert registry.get(KEY, "1").func is not registry.get(KEY, "2").func
    assert registry.get(KEY, "1").version == "1"
    assert (KEY, ("1", "2")) in registry.served()
    assert registry.keys().count(KEY) == 1


def test_a_function_registered_again_keeps_its_place(register):
    def one(ctx: jobqueue.JobContext) -> None: ...

    register("1", one)
    register("2")
    register("1", one)  # its module imported twice
    assert registry.get(KEY).version == "2"


def test_a_version_registered_to_another_function_is_refused(register):
    register("1")

    def other(ctx: jobqueue.JobContext) -> None: ...

    with pytest.raises(HandlerRegistrationError, match="version '1' is already registered"):
        jobqueue.handler(KEY, takes_context=True, version="1")(other)


@pytest.mark.parametrize("bad", [2, None, " 2", "2 ", "-2", "a/b", "x" * 51, "v\n"])
def test_a_bad_version_is_refused(bad):
    with pytest.raises(HandlerRegistrationError, match="version"):
        jobqueue.handler(KEY, version=bad)
    assert KEY not in registry.allowlist()


def test_an_unknown_version_is_an_unknown_handler(register):
    register("1")
    with pytest.raises(UnknownHandlerError, match="has no version '9'"):
        registry.get(KEY, "9")


def test_unregistering_a_version_makes_the_one_before_the_newest(register):
    register("1")
    register("2")
    registry.unregister(KEY, "2")
    assert registry.get(KEY).version == "1"
    registry.unregister(KEY, "1")
    assert KEY not in registry.allowlist()


def test_a_worker_row_lists_only_the_keys_with_versions(register):
    register("")
    register("2")
    row = versions.worker_row(registry.served())
    assert row[KEY] == ["", "2"]
    assert "test.add" not in row  # "" only: its `handlers` entry says enough


# -- the version of a job ------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_new_job_runs_under_the_newest_version_and_keeps_it(register):
    register("1")
    register("2")
    job = jobqueue.enqueue(KEY)
    assert job.handler_version == ""  # not started: its first claim gives it a version
    run_jobs()
    job.refresh_from_db()
    assert (job.state, job.result, job.handler_version) == ("done", "ran 2", "2")


@pytest.mark.django_db
def test_a_started_job_runs_under_its_own_version(register):
    register("1")
    register("2")
    old = started(version="1")
    run_jobs()
    old.refresh_from_db()
    assert (old.state, old.result, old.handler_version) == ("done", "ran 1", "1")


@pytest.mark.django_db
def test_a_job_whose_version_this_process_lacks_waits(register):
    register("2")
    old = started(version="1")
    unversioned = started(version="")  # started before its handler had a version
    fresh = jobqueue.enqueue(KEY)
    report = run_jobs()
    assert [job.pk for job in report.jobs] == [fresh.pk]
    for job in (old, unversioned):
        job.refresh_from_db()
        assert (job.state, job.attempts) == ("ready", 0)
    # Registered again (a worker of the release before comes back): it runs.
    register("1")
    register("")
    run_jobs()
    old.refresh_from_db()
    unversioned.refresh_from_db()
    assert (old.state, old.result) == ("done", "ran 1")
    assert (unversioned.state, unversioned.result, unversioned.handler_version) == (
        "done",
        "ran unversioned",
        "",
    )


@pytest.mark.django_db
def test_a_handler_without_versions_never_takes_a_job_started_under_one(register):
    register("")
    newer = started(version="2")  # a newer release's worker began it
    assert run_jobs().jobs == []
    newer.refresh_from_db()
    assert (newer.state, newer.handler_version) == ("ready", "2")


@pytest.mark.django_db
def test_a_retried_job_keeps_its_version(register):
    register("1")

    def fails(ctx: jobqueue.JobContext) -> None:
        raise jobqueue.Fail("no")

    register("2", fails)
    job = jobqueue.enqueue(KEY)
    run_jobs()
    job.refresh_from_db()
    assert (job.state, job.handler_version) == ("dead", "2")
    registry.unregister(KEY, "2")
    register("3")
    jobqueue.retry(job)
    assert run_jobs().jobs == []  # no "2" here: it waits
    register("2")  # the code of "2" deployed again, fixed
    run_jobs()
    job.refresh_from_db()
    assert (job.state, job.result, job.handler_version) == ("done", "ran 2", "2")


# -- what operators see --------------------------------------------------------------------------


def stats_json() -> dict[str, Any]:
    out = StringIO()
    call_command("jobqueue_stats", "--json", stdout=out)
    return json.loads(out.getvalue())


def live_worker(name: str, handler_versions: dict[str, list[str]] | None) -> Worker:
    now = timezone.now()
    return Worker.objects.create(
        id=name,
        host="host",
        pid=1,
        queues=[],
        concurrency=1,
        started_at=now,
        heartbeat_at=now,
        expires_at=now + dt.timedelta(hours=1),
        handlers=[KEY, "test.add"],
        handler_versions=handler_versions,
    )


@pytest.mark.django_db
def test_stats_count_the_jobs_waiting_for_a_version_no_live_worker_has(register):
    register("2")
    started(version="1")
    started(version="1", state="scheduled", run_after=timezone.now() + dt.timedelta(hours=1))
    started(version="2")
    started(version="")  # started unversioned: waits too
    jobqueue.enqueue(KEY)  # not started: any version runs it
    live_worker("w-2", {KEY: ["2"]})
    figures = stats_json()
    assert figures["unserved_versions"] == {KEY: {"": 1, "1": 2}}
    assert figures["unknown_handlers"] == {}
    out = StringIO()
    call_command("jobqueue_stats", stdout=out)
    assert f"{KEY}@(none) (1)" in out.getvalue()  # as the check W005 and the admin say it
    # A worker of the release before versions (its row has none): it serves "" only.
    live_worker("w-old", None)
    assert stats_json()["unserved_versions"] == {KEY: {"1": 2}}
    out = StringIO()
    call_command("jobqueue_stats", stdout=out)
    assert f"2 started job(s) wait for a handler version no live worker has: {KEY}@1 (2)" in (
        out.getvalue()
    )


@pytest.mark.django_db
def test_the_system_check_warns_of_started_jobs_whose_version_no_live_worker_has(register):
    register("2")
    started(version="1")
    started(version="")
    jobqueue.enqueue(KEY)  # not started: any version runs it
    assert checks.check_database(databases=["default"]) == []  # no live worker to compare
    live_worker("w-2", {KEY: ["2"]})
    [warning] = checks.check_database(databases=["default"])
    assert warning.id == "django_jobqueue.W005"
    assert f"no live worker has: {KEY}@(none) (1), {KEY}@1 (1)." in warning.msg
    live_worker("w-both", {KEY: ["", "1", "2"]})
    assert checks.check_database(databases=["default"]) == []


@pytest.mark.django_db
def test_stats_without_live_workers_compare_with_this_process(register):
    register("1")
    register("2")
    started(version="1")
    started(version="3")
    assert stats_json()["unserved_versions"] == {KEY: {"3": 1}}


@pytest.mark.django_db
def test_the_admin_shows_and_filters_versions(admin_client: Client, register):
    register("1")
    register("2")
    one = started(version="1")
    none = started(version="")
    fresh = jobqueue.enqueue(KEY)
    url = reverse("admin:django_jobqueue_job_changelist")
    page = admin_client.get(url).content.decode()
    assert "<th" in page and "version" in page
    listed = admin_client.get(url, {"version": "1"}).context["cl"].result_list
    assert [job.pk for job in listed] == [one.pk]
    listed = admin_client.get(url, {"version": "-"}).context["cl"].result_list
    assert sorted(job.pk for job in listed) == sorted([none.pk, fresh.pk])
    choices = [c["display"] for c in _filter_choices(admin_client, url, "handler version")]
    assert {"(none)", "1", "2"} <= set(choices)
    page = admin_client.get(reverse("admin:django_jobqueue_job_change", args=[one.pk]))
    assert "1 (every run of the job uses this version)" in page.content.decode()
    page = admin_client.get(reverse("admin:django_jobqueue_job_change", args=[fresh.pk]))
    assert "not started: its first run takes the newest version" in page.content.decode()


def _filter_choices(client: Client, url: str, title: str) -> list[dict[str, Any]]:
    response = client.get(url)
    for spec in response.context["cl"].filter_specs:
        if str(spec.title) == title:
            return list(spec.choices(response.context["cl"]))
    raise AssertionError(f"no filter {title!r}")


@pytest.mark.django_db
def test_the_overview_names_started_jobs_whose_version_no_live_worker_has(
    admin_client: Client, register
):
    register("2")
    one = started(version="1")
    started(version="2")
    live_worker("w-2", {KEY: ["2"]})
    response = admin_client.get(reverse("admin:django_jobqueue_queueoverview_changelist"))
    rows = response.context["stats"]["unserved_versions"]
    assert [(r["type"], r["version"], r["count"]) for r in rows] == [(KEY, "1", 1)]
    assert "Waiting for a handler version" in response.content.decode()
    listed = admin_client.get(rows[0]["url"]).context["cl"].result_list
    assert [job.pk for job in listed] == [one.pk]
    live_worker("w-both", {KEY: ["1", "2"]})
    response = admin_client.get(reverse("admin:django_jobqueue_queueoverview_changelist"))
    assert response.context["stats"]["unserved_versions"] == []
    assert "Waiting for a handler version" not in response.content.decode()
