"""Jobs, workers and users of the admin tests: one of each thing an operator looks at."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from typing import Any

from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_jobqueue.models import Job, JobDependency, Worker
from tests.support.factories import JobFactory

PASSWORD = "not-secret-pw"

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "reports/jobs.py", line 12, in build\n'
    "    raise RuntimeError(message)\n"
    "RuntimeError: upstream API returned 502\nsecond line"
)


def error(attempt: int, message: str = "upstream API returned 502\nsecond line") -> dict[str, Any]:
    return {
        "type": "builtins.RuntimeError",
        "message": message,
        "traceback": TRACEBACK,
        "attempt": attempt,
    }


@dataclasses.dataclass
class Scenario:
    """What the admin pages show: each kind of job and worker once."""

    live_worker: Worker
    stale_worker: Worker
    ready: Job
    running: Job
    stuck: Job
    dead: Job
    done: Job
    container: Job
    child_done: Job
    child_dead: Job
    downstream: Job

    def jobs(self) -> list[Job]:
        return [
            self.ready,
            self.running,
            self.stuck,
            self.dead,
            self.done,
            self.container,
            self.child_done,
            self.child_dead,
            self.downstream,
        ]


def build() -> Scenario:
    """Write the scenario's rows (states as a worker would have left them)."""
    now = timezone.now()
    ago = lambda seconds: now - dt.timedelta(seconds=seconds)  # noqa: E731
    live = Worker.objects.create(
        id="web-1:4242:a1b2",
        host="web-1",
        pid=4242,
        queues=["default", "emails"],
        concurrency=4,
        started_at=ago(3600),
        heartbeat_at=ago(2),
        expires_at=now + dt.timedelta(seconds=28),
        job_ids=[],
    )
    stale = Worker.objects.create(
        id="web-2:999:c3d4",
        host="web-2",
        pid=999,
        queues=[],
        concurrency=2,
        started_at=ago(7200),
        heartbeat_at=ago(95),
        expires_at=ago(65),
        job_ids=[],
    )
    ready = JobFactory(type="emails.send", queue="emails", group_key="acme", args={"to": "a@x"})
    running = JobFactory(
        type="reports.build",
        state=Job.State.RUNNING,
        attempts=1,
        lease_owner=live.pk,
        lease_expires=now + dt.timedelta(seconds=28),
        heartbeat_at=ago(2),
        started_at=ago(75),
        worker_ids=[live.pk],
    )
    live.job_ids = [running.pk]
    live.save()
    stuck = JobFactory(
        type="reports.build",
        state=Job.State.RUNNING,
        attempts=1,
        lease_owner=stale.pk,
        lease_expires=ago(40),
        heartbeat_at=ago(95),
        started_at=ago(300),
        worker_ids=[stale.pk],
    )
    dead = JobFactory(
        type="reports.fetch",
        state=Job.State.DEAD,
        attempts=3,
        max_attempts=3,
        finished_at=ago(600),
        args={"account_id": 7, "note": "<b>escaped</b>"},
        errors=[error(1), error(2), error(3)],
        last_error=error(3),
        unique_key="fetch-7",
        unique_slot=None,
    )
    done = JobFactory(
        type="reports.fetch",
        state=Job.State.DONE,
        attempts=1,
        finished_at=ago(30),
        result={"rows": 42, "files": ["a.csv", "b.csv"]},
    )
    container = JobFactory(
        type="workflow.nightly",
        state=Job.State.DEAD,
        is_container=True,
        sealed=True,
        finished_at=ago(50),
    )
    child_done = JobFactory(
        type="reports.fetch",
        state=Job.State.DONE,
        parent=container,
        attempts=1,
        finished_at=ago(55),
        has_dependents=False,
    )
    child_dead = JobFactory(
        type="reports.fetch",
        state=Job.State.DEAD,
        parent=container,
        attempts=2,
        max_attempts=2,
        finished_at=ago(52),
        errors=[error(1), error(2)],
        last_error=error(2),
        has_dependents=True,
    )
    downstream = JobFactory(
        type="reports.build",
        state=Job.State.CANCELLED,
        parent=container,
        cancelled_by=child_dead,
        finished_at=ago(52),
        last_error={
            "type": "django_jobqueue.exceptions.UpstreamFailed",
            "message": f"upstream job {child_dead.pk} ended dead",
            "traceback": "",
        },
    )
    JobDependency.objects.create(job=downstream, depends_on=child_dead)
    return Scenario(
        live,
        stale,
        ready,
        running,
        stuck,
        dead,
        done,
        container,
        child_done,
        child_dead,
        downstream,
    )


def every_page(s: Scenario) -> list[str]:
    """Every admin page of the app, with real rows behind it."""
    return [
        url("job_changelist"),
        *[url("job_change", job.pk) for job in s.jobs()],
        url("livelease_changelist"),
        url("deadjob_changelist"),
        url("worker_changelist"),
        url("worker_change", s.live_worker.pk),
        url("queueoverview_changelist"),
    ]


def make_user(name: str, *perms: str, staff: bool = True) -> User:
    """A staff user holding `perms` (codenames of django_jobqueue permissions)."""
    user = User.objects.create_user(name, password=PASSWORD, is_staff=staff)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="django_jobqueue", codename__in=perms)
    )
    return user


def login(user: User, **kwargs: Any) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


def url(name: str, *args: Any) -> str:
    return reverse(f"admin:django_jobqueue_{name}", args=args)


def run_action(
    client: Client, model: str, action: str, ids: list[int], **extra: Any
) -> tuple[int, list[str]]:
    """POST `action` on `ids` from a changelist; return the status and the messages shown."""
    data = {"action": action, "_selected_action": [str(pk) for pk in ids], **extra}
    response = client.post(url(f"{model}_changelist"), data, follow=True)
    return response.status_code, [str(m) for m in response.context["messages"]] if (
        response.context and "messages" in response.context
    ) else []


def csrf_token(client: Client, path: str) -> str:
    """The CSRF token of the form on the page at `path`."""
    html = client.get(path).content.decode()
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert found, "no CSRF token on the page"
    return found.group(1)


def hrefs(html: str) -> list[str]:
    """The targets of the links on a page, as written in its HTML."""
    return re.findall(r'href="([^"]+)"', html)
