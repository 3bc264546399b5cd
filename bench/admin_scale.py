"""The admin's pages with a million jobs in the table: each page's load time.

`BENCH_DB=pg|mysql|sqlite python -m bench.admin_scale [--jobs 1000000]`

Fills the jobs table server-side (INSERT ... SELECT over a recursive sequence: 95% done, 2%
dead, 1% cancelled, 1% ready, the rest waiting or scheduled, 100 running; four queues, five
handler keys, twenty groups, finish times spread over a day) plus a workflow of a container
with 2,000 children that ran over an hour (some retried, some slept), a durable job that died
after three steps, and two days of per-minute figures of four workers (the overview's
charts, and per handler key its per-handler table), then times every admin page through
Django's test client as a superuser, and the confirmation page of "select all" over the
20,000 dead jobs: the median and the best of 7 loads after one warm-up. A benchmark, never a
test. `bench/admin_browser.py` then drives the same database in chromium.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DB = os.environ.get("BENCH_DB", "sqlite")
RUNS = 7

QUEUES = ("default", "emails", "reports", "webhooks")
TYPES = ("reports.fetch", "reports.build", "emails.send", "webhooks.deliver", "images.resize")


def setup() -> None:
    """Create the benchmark's own database, set Django up and migrate."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.project.admin_settings"
    sys.path.insert(0, str(ROOT))
    name = os.environ.get("BENCH_ADMIN_DB_NAME", "jobqueue_bench_admin")
    if DB == "pg":
        subprocess.run(["dropdb", "-h", "127.0.0.1", "-U", "postgres", "--if-exists", name])
        subprocess.run(["createdb", "-h", "127.0.0.1", "-U", "postgres", name], check=True)
    elif DB == "mysql":
        sql = f"DROP DATABASE IF EXISTS {name}; CREATE DATABASE {name} CHARACTER SET utf8mb4"
        subprocess.run(["mariadb", "-uroot", "-h127.0.0.1", "-e", sql], check=True)
    import django

    django.setup()
    from django.conf import settings

    if DB == "sqlite":
        for suffix in ("", "-wal", "-shm"):
            Path(settings.DATABASES["default"]["NAME"] + suffix).unlink(missing_ok=True)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _case(expr: str, values: tuple[str, ...]) -> str:
    whens = " ".join(f"WHEN {i} THEN '{v}'" for i, v in enumerate(values))
    return f"CASE {expr} % {len(values)} {whens} END"


def fill(total: int) -> None:
    """Insert `total` jobs in a few statements, computed by the database itself."""
    from django.db import connection

    from django_jobqueue.models import Job

    vendor = connection.vendor
    ago = {
        "postgresql": "now() - ((n % 86400) * interval '1 second')",
        "mysql": "UTC_TIMESTAMP(6) - INTERVAL (n % 86400) SECOND",
        "sqlite": "strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || (n % 86400) || ' seconds')",
    }[vendor]
    ahead = {  # scheduled jobs: due within the next day
        "postgresql": "now() + ((n % 86400) * interval '1 second')",
        "mysql": "UTC_TIMESTAMP(6) + INTERVAL (n % 86400) SECOND",
        "sqlite": "strftime('%Y-%m-%d %H:%M:%f', 'now', '+' || (n % 86400) || ' seconds')",
    }[vendor]
    json = "::jsonb" if vendor == "postgresql" else ""
    false = "FALSE" if vendor != "sqlite" else "0"
    error = (
        '{"type": "builtins.RuntimeError", "message": "upstream API returned 502", '
        '"traceback": "Traceback (most recent call last): ...", "attempt": 3}'
    )
    state = (
        "CASE WHEN n % 1000 < 950 THEN 'done' WHEN n % 1000 < 970 THEN 'dead' "
        "WHEN n % 1000 < 980 THEN 'cancelled' WHEN n % 1000 < 990 THEN 'ready' "
        "WHEN n % 1000 < 995 THEN 'waiting' ELSE 'scheduled' END"
    )
    finished = "n % 1000 < 980"
    columns = (
        "type, args, state, attempts, max_attempts, queue, priority, group_key, weight, "
        "errors, worker_ids, is_container, sealed, cancel_requested, has_dependents, "
        "has_children, has_steps, "
        "open_children, unique_slot, created_at, updated_at, finished_at, run_after, "
        "last_error, result"
    )
    groups = tuple(f"tenant-{g}" for g in range(20))
    # The arguments: a tenant out of 10,000 (an argument search finds 100 jobs of one).
    args = {
        "postgresql": "('{\"account_id\": 7, \"tenant_id\": ' || (n % 10000) || '}')::jsonb",
        "mysql": "CONCAT('{\"account_id\": 7, \"tenant_id\": ', n % 10000, '}')",
        "sqlite": "'{\"account_id\": 7, \"tenant_id\": ' || (n % 10000) || '}'",
    }[vendor]
    values = (
        f"{_case('n', TYPES)}, {args}, {state}, "
        f"CASE WHEN n % 1000 < 980 THEN 1 ELSE 0 END, 3, {_case('n', QUEUES)}, 0, "
        f"{_case('n', groups)}, 1, '[]'{json}, '[]'{json}, {false}, {false}, {false}, "
        f"{false}, {false}, {false}, 0, CASE WHEN {finished} THEN NULL ELSE 1 END, {ago}, {ago}, "
        f"CASE WHEN {finished} THEN {ago} ELSE NULL END, "
        f"CASE WHEN n % 1000 >= 995 THEN {ahead} ELSE NULL END, "
        f"CASE WHEN n % 1000 >= 950 AND n % 1000 < 970 THEN '{error}'{json} ELSE NULL END, "
        f"CASE WHEN n % 1000 < 950 THEN '{{\"rows\": 42}}'{json} ELSE NULL END"
    )
    seq = (
        "WITH RECURSIVE d(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM d WHERE i < 999) "
        "SELECT {values} FROM (SELECT a.i * 1000 + b.i AS n FROM d AS a, d AS b) AS s "
        "WHERE n < {total}"
    )
    if vendor == "postgresql":  # generate_series: no recursion needed
        seq = "SELECT {values} FROM generate_series(0, {total} - 1) AS s(n)"
    with connection.cursor() as cursor:
        # No parameters: then no driver reads the % of the SQL as a placeholder.
        sql = seq.format(values=values, total=int(total))
        cursor.execute(f"INSERT INTO {Job._meta.db_table} ({columns}) {sql}")
    # A few running jobs under a (fake) live worker, the lease columns as a claim sets them.
    _running(100)


def _running(count: int) -> None:
    import datetime as dt

    from django.utils import timezone

    from django_jobqueue.models import Job, Worker

    now = timezone.now()
    worker = Worker.objects.create(
        id="bench:1:admin",
        host="bench",
        pid=1,
        queues=list(QUEUES),
        concurrency=count,
        started_at=now,
        heartbeat_at=now,
        expires_at=now + dt.timedelta(seconds=30),
    )
    ids = list(
        Job.objects.filter(state="ready").order_by("-pk").values_list("pk", flat=True)[:count]
    )
    Job.objects.filter(pk__in=ids).update(
        state="running",
        attempts=1,
        lease_owner=worker.pk,
        started_at=now,
        heartbeat_at=now,
        lease_expires=now + dt.timedelta(seconds=30),
    )
    Worker.objects.filter(pk=worker.pk).update(job_ids=ids)


def workflow() -> tuple[int, int]:
    """A container of 2,000 children, each downstream of one job: return (container, child)."""
    from django.db import transaction

    import django_jobqueue as jobqueue
    from django_jobqueue import registry

    for key in TYPES:
        if key not in set(registry.keys()):
            registry.handler(key)(lambda **kwargs: None)
    with transaction.atomic(), jobqueue.graph() as g:
        first = g.add("reports.fetch", {"account_id": 1})
        box = g.container("nightly")
        children = [
            g.add("reports.build", {"account_id": n}, parent=box, depends_on=[first])
            for n in range(2000)
        ]
    return int(box.pk), int(children[0].pk)


def long_work(box: int) -> int:
    """The workflow ran: its children done over an hour (every 50th retried, every 40th slept
    a minute); a durable job died after three steps; two days of figures (the charts', and per
    handler key). Returns the durable job's id."""
    import datetime as dt

    from django.utils import timezone

    from django_jobqueue.metrics import LATENCY_BUCKETS, minute_of
    from django_jobqueue.models import Job, JobStep, MinuteCount, MinuteSample

    now = timezone.now()
    start = now - dt.timedelta(hours=1, minutes=5)
    children = list(Job.objects.filter(parent_id=box).order_by("pk"))
    steps = []
    for n, job in enumerate(children):
        job.first_started_at = start + dt.timedelta(seconds=n * 1.7)
        job.started_at = job.first_started_at + dt.timedelta(seconds=20 if n % 50 == 0 else 0)
        job.finished_at = job.started_at + dt.timedelta(seconds=30 + n % 17)
        job.state, job.attempts = "done", 2 if n % 50 == 0 else 1
        job.errors = [{"type": "builtins.RuntimeError", "message": "502", "attempt": 1}] * (
            n % 50 == 0
        )
        if n % 40 == 0:
            steps.append(JobStep(job=job, name="@sleep", seq=1, attempt=1, result={"seconds": 60}))
    Job.objects.bulk_update(
        children,
        ["first_started_at", "started_at", "finished_at", "state", "attempts", "errors"],
        batch_size=500,
    )
    Job.objects.filter(parent_id=box).update(lease_owner=None, lease_expires=None)
    JobStep.objects.bulk_create(steps)
    for step in steps:  # recorded as the child slept, 5 s into its run
        JobStep.objects.filter(pk=step.pk).update(
            created_at=step.job.first_started_at + dt.timedelta(seconds=5)
        )
    durable = Job.objects.create(
        type="reports.build",
        args={"account_id": 3},
        state="dead",
        attempts=1,
        max_attempts=1,
        finished_at=now,
        last_error={"type": "builtins.RuntimeError", "message": "failing after page 3"},
        has_steps=True,
    )
    JobStep.objects.bulk_create(
        [
            JobStep(job=durable, name="page", seq=n, attempt=1, result={"page": n}, duration=0.4)
            for n in range(1, 4)
        ]
    )
    minutes = [minute_of(now) - dt.timedelta(minutes=i) for i in range(2 * 24 * 60)]
    wave = [1 + (i % 90) / 90 for i in range(len(minutes))]
    latency = [0] * (len(LATENCY_BUCKETS) + 1)
    latency[1], latency[3], latency[6] = 400, 80, 9
    MinuteCount.objects.bulk_create(
        [
            MinuteCount(
                minute=m,
                worker=f"bench:{w}",
                started=int(300 * wave[i]),
                finished=int(290 * wave[i]),
                failed=int(6 * wave[i]) if i % 7 else 40,
                latency=latency,
            )
            for i, m in enumerate(minutes)
            for w in range(4)
        ],
        batch_size=2000,
    )
    MinuteSample.objects.bulk_create(
        [
            MinuteSample(
                minute=m, queue=q, ready=int(500 * wave[i] * (k + 1)), oldest_ready=2.0 * wave[i]
            )
            for i, m in enumerate(minutes)
            for k, q in enumerate(QUEUES)
        ],
        batch_size=2000,
    )
    handler_figures(minutes, wave)
    return int(durable.pk)


def handler_figures(minutes: list[Any], wave: list[float]) -> None:
    """The same workers' figures per handler key (the overview's per-handler table): their
    claims and outcomes split over the five handler keys."""
    from django_jobqueue.models import MinuteHandlerCount

    MinuteHandlerCount.objects.bulk_create(
        [
            MinuteHandlerCount(
                minute=m,
                worker=f"bench:{w}",
                handler=t,
                started=int(60 * wave[i]),
                done=int(57 * wave[i]),
                failed=int(1.2 * wave[i]) if i % 7 else 8,
                dead=1 if i % 7 == 0 else 0,
            )
            for i, m in enumerate(minutes)
            for w in range(4)
            for t in TYPES
        ],
        batch_size=2000,
    )


def pages(box: int, child: int) -> dict[str, str]:
    from django.urls import reverse

    from django_jobqueue.models import Job

    jobs = reverse("admin:django_jobqueue_job_changelist")
    dead = Job.objects.filter(state="dead").order_by("-pk").values_list("pk", flat=True)[0]
    return {
        "index": reverse("admin:index"),
        "jobs": jobs,
        "jobs page 20": jobs + "?p=20",
        "jobs state=dead": jobs + "?state=dead",
        "jobs state=waiting": jobs + "?state=waiting",
        "jobs queue=emails": jobs + "?queue=emails",
        "jobs group=tenant-7": jobs + "?group=tenant-7",
        "jobs type=images.resize": jobs + "?type=images.resize",
        "jobs has_error=yes": jobs + "?has_error=yes",
        "jobs search id": jobs + f"?q={dead}",
        "jobs search type": jobs + "?q=emails.send",
        # 100 jobs of the million hold it; the other finds none (the whole table read).
        "jobs search args.tenant_id=42": jobs + "?q=args.tenant_id%3D42",
        "jobs search args (no match)": jobs + "?q=args.tenant_id%3D123456",
        "dead jobs search args.tenant_id=42": reverse("admin:django_jobqueue_deadjob_changelist")
        + "?q=args.tenant_id%3D42",
        "jobs children of container": jobs + f"?container={box}",
        "job page (dead)": reverse("admin:django_jobqueue_job_change", args=[dead]),
        "job page (container, 2,000 children)": reverse(
            "admin:django_jobqueue_job_change", args=[box]
        ),
        "job page (child)": reverse("admin:django_jobqueue_job_change", args=[child]),
        "job page (durable, dead after 3 steps)": reverse(
            "admin:django_jobqueue_job_change",
            args=[Job.objects.filter(has_steps=True, state="dead").values_list("pk", flat=True)[0]],
        ),
        "live leases": reverse("admin:django_jobqueue_livelease_changelist"),
        "dead jobs": reverse("admin:django_jobqueue_deadjob_changelist"),
        "workers": reverse("admin:django_jobqueue_worker_changelist"),
        "overview": reverse("admin:django_jobqueue_queueoverview_changelist"),
        "overview, last day": reverse("admin:django_jobqueue_queueoverview_changelist")
        + "?range=day",
        "jobs created=24h": jobs + "?created=24h",
        "jobs finished=1h": jobs + "?finished=1h",
        "dead jobs finished=7d": reverse("admin:django_jobqueue_deadjob_changelist")
        + "?finished=7d",
        "limits": reverse("admin:django_jobqueue_limit_changelist"),
    }


def time_pages(urls: dict[str, str]) -> dict[str, float]:
    """Median milliseconds per page, after one warm-up load."""
    from django.contrib.auth.models import User
    from django.test import Client

    client = Client()
    user = User.objects.filter(username="bench").first()
    client.force_login(user or User.objects.create_superuser("bench", "b@example.com", "x"))
    figures = {}
    for name, url in urls.items():
        assert client.get(url).status_code == 200, url
        times = []
        for _ in range(RUNS):
            started = time.perf_counter()
            response = client.get(url)
            times.append(time.perf_counter() - started)
            assert response.status_code == 200, url
        figures[name] = statistics.median(times) * 1000
        figures[f"{name} (best)"] = min(times) * 1000
        print(f"{name:40s} {figures[name]:8.1f} ms  best {min(times) * 1000:8.1f} ms", flush=True)
    return figures


def time_select_all() -> dict[str, float]:
    """The confirmation page of "select all" over every dead job (a POST; nothing is done)."""
    from django.contrib.auth.models import User
    from django.test import Client
    from django.urls import reverse

    from django_jobqueue.models import Job

    client = Client()
    client.force_login(User.objects.get(username="bench"))
    first = Job.objects.filter(state="dead").values_list("pk", flat=True)[0]
    data = {
        "action": "retry_jobs",
        "index": "0",
        "select_across": "1",
        "_selected_action": [str(first)],
        "extra_attempts": "1",
    }
    page = reverse("admin:django_jobqueue_deadjob_changelist")
    times = []
    for _ in range(RUNS + 1):
        started = time.perf_counter()
        response = client.post(page, data)
        times.append(time.perf_counter() - started)
        assert response.status_code == 200 and b"jq-bulk-count" in response.content
    name = "select all dead: confirmation"
    median = statistics.median(times[1:]) * 1000
    print(f"{name:40s} {median:8.1f} ms  best {min(times[1:]) * 1000:8.1f} ms", flush=True)
    return {name: median, f"{name} (best)": min(times[1:]) * 1000}


def main() -> None:
    from bench import harness

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument(
        "--reuse", action="store_true", help="time the pages again, on the last run's rows"
    )
    opts = parser.parse_args()
    if opts.reuse:
        os.environ["DJANGO_SETTINGS_MODULE"] = "bench.project.admin_settings"
        sys.path.insert(0, str(ROOT))
        import django

        django.setup()
        from django_jobqueue.models import Job

        box = int(Job.objects.filter(is_container=True).values_list("pk", flat=True)[0])
        child = int(Job.objects.filter(parent_id=box).values_list("pk", flat=True)[0])
        opts.jobs = Job.objects.count()
    else:
        setup()
        started = time.perf_counter()
        fill(opts.jobs)
        box, child = workflow()
        long_work(box)
        harness.analyze()
        took = time.perf_counter() - started
        print(f"{DB}: filled {opts.jobs} jobs in {took:.1f} s", flush=True)
    figures: dict[str, Any] = time_pages(pages(box, child))
    figures.update(time_select_all())
    harness.report("admin_scale", {"rows": opts.jobs, **figures})


if __name__ == "__main__":
    main()
