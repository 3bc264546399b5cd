"""Django tasks of the tests of handler versions with worker processes (Django 6.1+: their
versions are given in @task(...)): the handlers of version_jobs.py as tasks with
takes_context=True, and what a process registers depends on its environment in the same way.

The versions of versioned_report: the release with "1" only defines it as version 1; one with
"2" defines version 2 under the same name, with version 1 in its older_versions when it has it
too (the code of version 1 kept beside it, renamed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.tasks import task

from .version_jobs import NEW, REPORT_VERSIONS


def _report(version: str) -> Callable[..., Any]:
    def report(context: Any, sleep: float) -> dict[str, Any]:
        """Record which version began the job, sleep, say which version ended it and where."""
        first = context.step("first", lambda: version)
        context.sleep(sleep)
        return {"first": first, "version": version, "worker": context.job.worker_id}

    report.__qualname__ = report.__name__ = f"versioned_report_v{version}"
    return report


def _newest() -> Any:
    newest = REPORT_VERSIONS[-1]
    func = _report(newest)
    func.__qualname__ = func.__name__ = "versioned_report"  # one task, whatever the release
    older = {version: _report(version) for version in REPORT_VERSIONS[:-1]}
    return task(takes_context=True, version=newest, older_versions=older)(func)


versioned_report = _newest()


@task(takes_context=True)
def reorder(context: Any, sleep: float) -> list[str]:
    """Steps a and b, then a sleep; the new release calls b before a."""
    order = ("b", "a") if NEW else ("a", "b")
    done = [context.step(name, lambda name=name: name) for name in order]
    context.sleep(sleep)
    return done


@task(takes_context=True)
def patch_point(context: Any, sleep: float) -> dict[str, Any]:
    """A step (the point), then a sleep; the new release asks patched("x") before the point."""
    took = context.patched("x") if NEW else None
    context.step("a", lambda: "a")
    context.sleep(sleep)
    return {"patched": took}
