"""Versions of a Django task (Django 6.1+, where @task(...) passes JobQueueTask's options on):
`@task(version=..., older_versions={...})` registers each version under the task's one key,
a started job runs under its own, and what cannot be a version is refused at definition.
(Real worker processes: tests/deploys/test_versions_workers.py.)"""

from __future__ import annotations

from typing import Any

import django
import pytest
from django.utils import timezone

from django_jobqueue import registry
from django_jobqueue.models import Job
from django_jobqueue.testing import run_jobs
from tests.support.markers import requires_task_options

pytestmark = requires_task_options("@task(**kwargs) is Django 6.1+ (or the django-tasks backport)")

if django.VERSION >= (6, 1):
    from django.tasks import task
    from django.tasks.exceptions import InvalidTask

    from django_jobqueue.backends import task_key
    from tests.testapp import version_tasks

    KEY = task_key("default", version_tasks.versioned_report.module_path)


def old_report(context: Any, sleep: float) -> str:
    """A version kept beside the task (module level, as Django wants of a task function)."""
    return "old"


def no_context(sleep: float) -> str:
    return "no context"


def test_a_task_s_versions_share_its_key_and_its_own_is_the_newest():
    assert KEY == "task:default:tests.testapp.version_tasks.versioned_report"
    assert registry.versions(KEY) == ("1", "2")
    assert registry.get(KEY).version == "2"
    assert registry.get(KEY, "1").func.func is not version_tasks.versioned_report.func
    assert registry.get(KEY).func.func is version_tasks.versioned_report.func
    assert version_tasks.versioned_report.version == "2"


@pytest.mark.django_db
def test_a_new_task_job_runs_under_the_newest_version_and_a_started_one_under_its_own():
    fresh = version_tasks.versioned_report.enqueue(sleep=0)
    old = Job.objects.create(
        type=KEY,
        args={"args": [], "kwargs": {"sleep": 0}},
        handler_version="1",
        first_started_at=timezone.now(),
    )
    run_jobs()
    fresh.refresh()
    assert fresh.return_value["version"] == "2"
    assert Job.objects.get(pk=fresh.id).handler_version == "2"
    old.refresh_from_db()
    assert (old.state, old.result["first"], old.result["version"]) == ("done", "1", "1")


def test_a_task_that_was_not_versioned_keeps_its_jobs_under_version_none():
    def report(context: Any, sleep: float) -> str:
        return "new"

    report.__qualname__ = "scratch_report"
    made = task(takes_context=True, version="2", older_versions={"": old_report})(report)
    key = task_key("default", made.module_path)
    try:
        assert registry.versions(key) == ("", "2")
    finally:
        registry.unregister(key)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"version": "2 "}, "Version '2 ' is invalid"),
        ({"version": "1", "older_versions": {"1": old_report}}, "is the task's own"),
        ({"version": "2", "older_versions": {"x/y": old_report}}, "Version 'x/y' is invalid"),
        ({"version": "2", "older_versions": {"1": "old_report"}}, r"older_versions\['1'\]"),
        ({"version": "2", "older_versions": {"1": no_context}}, "first argument 'context'"),
        ({"version": "2", "older_versions": [("1", old_report)]}, "must be a dict"),
    ],
)
def test_what_cannot_be_a_task_version_is_refused(options, match):
    def report(context: Any, sleep: float) -> str:
        return "new"

    report.__qualname__ = "refused_report"
    with pytest.raises(InvalidTask, match=match):
        task(takes_context=True, **options)(report)
    assert task_key("default", f"{__name__}.refused_report") not in registry.allowlist()
