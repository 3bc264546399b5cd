"""manage.py shop_demo: the story `make demo` tells, on a fresh database.

Two tenants sync their catalogues side by side (a container of parallel jobs each, and a job
that waits for it), sharing one worker by weight, while three jobs of the operations team
show a retry, a dead job revived with `jobqueue.retry()`, and `jobqueue.cancel()`. A real
`jobqueue_worker` process runs the jobs; this command watches the Job table, shows it live,
reacts (pays the order, cancels the long job), draws the workflow and checks the outcome.
Needs `rich` (the `demo` extra).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.db.models import Count, Sum
from rich import box
from rich.console import Console
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table

import django_jobqueue as jobqueue
from django_jobqueue.admin import timeline
from django_jobqueue.admin.graph import render
from django_jobqueue.models import Job, JobStep, MinuteCount, ResourceStart
from shop.models import Order
from shop.tasks import email_tracking

TENANTS = {"acme": 3, "globex": 1}  # group -> weight
OPS = "ops"  # the operations team's jobs: weight 1
PORT = 8000  # of the example site: `make demo PORT=8001` and `make demo-site PORT=8001`
OVERVIEW = "/admin/django_jobqueue/queueoverview/"
FINAL = {Job.State.DONE, Job.State.DEAD, Job.State.CANCELLED}
COLUMNS = ["waiting", "scheduled", "ready", "running", "done", "dead", "cancelled"]
HEADERS = ["waiting", "sched.", "ready", "running", "done", "dead", "cancelled"]
PAUSE = 1.0  # seconds the story lets you look at a dead or running job before it acts
REPORT_MONTH, REPORT_PAGES = "2026-11", 5
NEXT_MONTH = "2026-12"  # its report is left waiting for an approval nobody sends
PAUSED_TENANT = "globex"  # paused at the end, with one job held back
REVIEWS = 4  # the model calls of shop.summarize_reviews


@dataclass
class Cast:
    """The jobs the story follows by name."""

    containers: dict[str, Job]
    publish: dict[str, Job]
    rates: Job
    ship: Job
    email: Job
    search: Job
    order: Order
    report: Job
    reviews: Job
    # Left for the admin to show: a dead job, and a job that waits for an event.
    unpaid: Job
    next_report: Job

    def roles(self) -> dict[int, str]:
        roles = {int(self.rates.pk): "rates", int(self.ship.pk): "ship"}
        roles |= {int(self.email.pk): "email", int(self.search.pk): "search"}
        roles[int(self.report.pk)] = "report"
        roles[int(self.reviews.pk)] = "reviews"
        roles[int(self.unpaid.pk)] = "unpaid"
        roles[int(self.next_report.pk)] = "next_report"
        for tenant in TENANTS:
            roles[int(self.containers[tenant].pk)] = f"container:{tenant}"
            roles[int(self.publish[tenant].pk)] = f"publish:{tenant}"
        return roles


@dataclass
class Watch:
    """What the live loop knows: the last states seen, and what the story has done."""

    start: float = field(default_factory=time.monotonic)
    states: dict[int, str] = field(default_factory=dict)
    errors: dict[int, int] = field(default_factory=dict)  # failed attempts reported, by job
    since: dict[int, float] = field(default_factory=dict)
    paid: bool = False
    cancelled: bool = False
    approved: bool = False

    def elapsed(self) -> float:
        return time.monotonic() - self.start


class Command(BaseCommand):
    help = (
        "Tell the demo's story on a fresh database: enqueue two tenants' workflows and three "
        "troublesome jobs, run a worker with a live display, draw the workflow, print a "
        "summary, and fail unless everything turned out as told."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        base = Path(settings.BASE_DIR)
        parser.add_argument("--products", type=int, default=60, help="Products per tenant.")
        parser.add_argument("--concurrency", type=int, default=4, help="Worker threads.")
        parser.add_argument("--svg", type=Path, default=base / "workflow.svg")
        parser.add_argument("--worker-log", type=Path, default=base / "demo-worker.log")
        parser.add_argument("--timeout", type=float, default=120.0, help="Seconds, at most.")
        parser.add_argument(
            "--port", type=int, default=PORT, help="The example site's port, for the links."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if Job.objects.exists():
            raise CommandError("The queue is not empty: run the demo on a fresh database.")
        console = Console()
        self.console = console
        self.options = options

        console.rule("[bold]1. Two tenants sync their catalogues")
        cast = enqueue_story(options["products"])
        for tenant, weight in TENANTS.items():
            box = cast.containers[tenant]
            console.print(
                f"[bold]{tenant}[/] (group={tenant!r}, weight={weight}): container "
                f"#{box.pk} {box.type!r} holds {options['products']} [cyan]shop.sync_product"
                f"[/] jobs that run in parallel; #{cast.publish[tenant].pk} "
                f"[cyan]shop.publish_catalogue[/] depends_on the container."
            )
        console.print(
            "Both tenants share one worker: while both have jobs waiting, acme (weight 3) "
            "gets about 3 of every 4 free slots, globex 1."
        )

        console.rule("[bold]2. Three jobs that won't go smoothly (group 'ops')")
        console.print(
            f"#{cast.rates.pk} [cyan]shop.fetch_rates[/]: its first attempt times out; it is "
            "retried after a short backoff (RETRY_BACKOFF 0.5 s here) and succeeds.\n"
            f"#{cast.ship.pk} [cyan]shop.ship_order[/] for {cast.order.number}, not paid yet: "
            f"it raises Fail and is dead at once, which cancels #{cast.email.pk} "
            "[cyan]shop.tasks.email_tracking[/] (a Django task, depends_on it). When the "
            "payment arrives, "
            "jobqueue.retry() revives both.\n"
            f"#{cast.search.pk} [cyan]shop.rebuild_search[/]: long; jobqueue.cancel() stops "
            "it while it runs.\n"
            f"#{cast.report.pk} [cyan]shop.monthly_report[/]: a durable job. It fetches "
            f"{REPORT_PAGES} pages, each once (ctx.step), then waits for a manager's approval "
            "(ctx.wait_for_event): it holds no thread meanwhile. jobqueue.send_event() "
            'approves it. Its handler has a version ("1"): a deploy that changes its steps '
            "adds version 2 beside it, and this job would still finish under 1.\n"
            f"#{cast.reviews.pk} [cyan]shop.summarize_reviews[/]: an async durable job that "
            f"makes {REVIEWS} model calls, each an async step that first takes 800 tokens of "
            "acme's daily budget (await ctx.acquire) and then settles what the model used "
            "(await ctx.settle), giving the rest back."
        )

        concurrency = options["concurrency"]
        console.rule(f"[bold]3. A worker runs them (jobqueue_worker --concurrency {concurrency})")
        self.run_worker(cast)

        console.rule("[bold]4. The workflow picture")
        acme = Job.objects.get(pk=cast.containers["acme"].pk)  # as it is now: done
        svg = write_svg(acme, options["svg"], options["port"])
        console.print(
            f"Wrote {svg}: container #{cast.containers['acme'].pk}, its children below "
            f"(the first 8, then '+N more') and #{cast.publish['acme'].pk} on the right. The "
            "admin draws the same picture on every job's page; the boxes link there."
        )

        console.rule("[bold]5. Summary")
        problems = self.summary(cast)
        problems += self.operators_view(cast)
        console.rule("[bold]6. Left for the admin to show")
        problems += self.leave_for_the_admin(cast)
        if problems:
            for problem in problems:
                console.print(f"[red]✗ {problem}")
            raise CommandError(f"The demo did not go as told: {len(problems)} problem(s).")
        console.print("[green]✓ Everything went as told.")
        console.print(f"The worker's log: {options['worker_log']}")
        site = f"http://127.0.0.1:{options['port']}"
        console.print(
            f"\nOpen the example site, logged in as admin / admin, at {site}/admin/ with:\n"
        )
        port = "" if options["port"] == PORT else f" PORT={options['port']}"
        console.print(f"    [bold]make demo-site{port}[/]", highlight=False)
        console.print(
            f"\nthen the overview, with this run's charts: {site}{OVERVIEW}\nand acme's "
            f"workflow, with its timeline: {site}/admin/django_jobqueue/job/"
            f"{cast.containers['acme'].pk}/change/"
        )

    def run_worker(self, cast: Cast) -> None:
        """Run jobqueue_worker in a subprocess; show the queue live until the story is over."""
        log = self.options["worker_log"]
        command = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "jobqueue_worker"]
        command += ["--concurrency", str(self.options["concurrency"]), "--prefetch", "0"]
        self.console.print(
            f"The worker logs every attempt to {log}. Below, the jobs by group and state, "
            "refreshed from the Job table, and what happens as it happens."
        )
        watch = Watch()
        roles = cast.roles()
        with open(log, "w") as output:
            worker = subprocess.Popen(
                command,
                cwd=settings.BASE_DIR,
                stdout=output,
                stderr=subprocess.STDOUT,
                env=os.environ.copy(),
            )
            try:
                with Live(
                    self.view(worker.pid, watch), console=self.console, refresh_per_second=8
                ) as live:
                    printed = 0.0
                    while True:
                        finished = self.step(cast, roles, watch)
                        live.update(self.view(worker.pid, watch))
                        if not self.console.is_terminal and watch.elapsed() - printed > 3:
                            # Not a terminal (CI, a pipe): Live shows only its last frame.
                            printed = watch.elapsed()
                            self.console.print(self.view(worker.pid, watch))
                        if finished:
                            break
                        if worker.poll() is not None:
                            raise CommandError(f"The worker exited ({worker.returncode}): {log}")
                        if watch.elapsed() > self.options["timeout"]:
                            raise CommandError(f"Not finished after {self.options['timeout']} s")
                        time.sleep(0.2)
            finally:
                if worker.poll() is None:
                    worker.send_signal(signal.SIGTERM)  # graceful: nothing is in flight now
                    try:
                        worker.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        worker.kill()
                        worker.wait()
        self.console.line()
        self.console.print(f"All jobs finished in {watch.elapsed():.1f} s; the worker stopped.")

    def step(self, cast: Cast, roles: dict[int, str], watch: Watch) -> bool:
        """Report what changed, act where the story says so; True once everything finished."""
        rows = Job.objects.filter(pk__in=roles).values_list(
            "pk", "type", "state", "attempts", "errors"
        )
        now = watch.elapsed()
        for pk, type_, state, attempts, errors in sorted(rows):
            # Each failed attempt leaves an entry in `errors`: report it even when the poll
            # missed the short `scheduled` state between the attempts.
            for error in errors[watch.errors.get(pk, 0) :]:
                kind = str(error.get("type", "")).rpartition(".")[2]
                self.say(
                    watch,
                    f"#{pk} [cyan]{type_}[/] [red]failed[/] attempt {error.get('attempt')}: "
                    f"{kind}: {error.get('message')}",
                )
            watch.errors[pk] = len(errors)
            before = watch.states.get(pk)
            if before != state:
                watch.states[pk], watch.since[pk] = state, now
                text = note(roles[pk], state, attempts)
                if before is not None and text:
                    self.say(watch, f"#{pk} [cyan]{type_}[/] {text}")
        ship, search = int(cast.ship.pk), int(cast.search.pk)
        if not watch.paid and watch.states[ship] == Job.State.DEAD and self.waited(watch, ship):
            with transaction.atomic():
                Order.objects.filter(pk=cast.order.pk).update(paid=True)
                jobqueue.retry(ship)
            watch.paid = True
            self.say(
                watch,
                f"[bold]The payment for {cast.order.number} arrives[/]: paid=True, "
                f"then jobqueue.retry(#{ship}): it runs again, and #{cast.email.pk} "
                "waits for it again.",
            )
        running = watch.states[search] == Job.State.RUNNING
        if not watch.cancelled and running and self.waited(watch, search):
            jobqueue.cancel(search)
            watch.cancelled = True
            self.say(
                watch,
                f"[bold]jobqueue.cancel(#{search})[/] while it runs: its handler "
                "sees ctx.cancelled at its next batch and stops.",
            )
        report = int(cast.report.pk)
        waiting = watch.states[report] == Job.State.WAITING
        if not watch.approved and waiting and self.waited(watch, report):
            jobqueue.send_event(f"approve-report:{REPORT_MONTH}", {"by": "the manager"})
            watch.approved = True
            self.say(
                watch,
                f"[bold]jobqueue.send_event('approve-report:{REPORT_MONTH}')[/]: #{report} "
                "runs again; its fetches return their stored results at once.",
            )
        if not (watch.paid and watch.cancelled and watch.approved):
            return False
        left = int(cast.next_report.pk)  # waits for its event: not final, by design
        if watch.states.get(left) != Job.State.WAITING:
            return False
        return not Job.objects.exclude(state__in=FINAL).exclude(pk=left).exists()

    def waited(self, watch: Watch, pk: int) -> bool:
        return watch.elapsed() - watch.since[pk] >= PAUSE

    def say(self, watch: Watch, text: str) -> None:
        self.console.print(f"[dim]{watch.elapsed():5.1f} s[/]  {text}")

    def view(self, pid: int, watch: Watch) -> Table:
        """Jobs by group and state (containers aside), with a progress bar per group."""
        counts: dict[str, dict[str, int]] = {g: {} for g in [*TENANTS, OPS]}
        rows = (
            Job.objects.filter(is_container=False)
            .values_list("group_key", "state")
            .annotate(n=Count("pk"))
        )
        for group, state, n in rows:
            column = "running" if state == Job.State.LEASED else state
            counts[group][column] = counts[group].get(column, 0) + n
        title = f"{watch.elapsed():5.1f} s, worker pid {pid}: jobs by group and state"
        table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, collapse_padding=True)
        table.add_column("group")
        table.add_column("w", justify="right")
        for header in HEADERS:
            table.add_column(header, justify="right")
        table.add_column("finished", min_width=12)
        for group, by_state in counts.items():
            total = sum(by_state.values())
            final = sum(by_state.get(state, 0) for state in FINAL)
            cells = [str(by_state.get(column, 0) or "") for column in COLUMNS]
            bar = ProgressBar(total=max(total, 1), completed=final, width=12)
            table.add_row(group, str(TENANTS.get(group, 1)), *cells, bar)
        return table

    def leave_for_the_admin(self, cast: Cast) -> list[str]:
        """Pause a tenant with a job of it held back; say what else is left; return problems."""
        jobqueue.pause_resource(f"tenant:{PAUSED_TENANT}")
        held = jobqueue.enqueue(
            "shop.sync_product",
            {"tenant": PAUSED_TENANT, "sku": "GLO-NEW", "ms": 200},
            group=PAUSED_TENANT,
            uses={f"tenant:{PAUSED_TENANT}": 1},
        )
        self.console.print(
            f"#{cast.unpaid.pk} [cyan]shop.ship_order[/] for ORD-0002 is [red]dead[/] (nobody "
            "paid): retry it from its page. "
            f"#{cast.next_report.pk} [cyan]shop.monthly_report[/] for {NEXT_MONTH} waits for "
            f"the event 'approve-report:{NEXT_MONTH}': send it from its page (Send event).\n"
            f"jobqueue.pause_resource('tenant:{PAUSED_TENANT}'): #{held.pk} "
            f"[cyan]shop.sync_product[/] (uses tenant:{PAUSED_TENANT}) is ready but held back, "
            "marked paused on the jobs list; resume the tenant on the Limits page. The "
            "Schedules page lists 'nightly-rates'."
        )
        problems = []
        left = {
            int(pk): state
            for pk, state in Job.objects.filter(
                pk__in=[cast.unpaid.pk, cast.next_report.pk, held.pk]
            ).values_list("pk", "state")
        }
        told = {
            int(cast.unpaid.pk): Job.State.DEAD,
            int(cast.next_report.pk): Job.State.WAITING,
            int(held.pk): Job.State.READY,
        }
        if left != told:
            problems.append(f"the jobs left for the admin are {left}, not {told}")
        return problems

    def operators_view(self, cast: Cast) -> list[str]:
        """Say what the admin shows of this run; return what it would lack."""
        figures = MinuteCount.objects.aggregate(f=Sum("finished"), x=Sum("failed"))
        ended = (figures["f"] or 0) + (figures["x"] or 0)
        ran = Job.objects.filter(is_container=False).exclude(started_at=None).count()
        self.console.print(
            f"The worker recorded its figures minute by minute ({figures['f'] or 0} attempts "
            f"finished, {figures['x'] or 0} failed): the admin's overview draws them (jobs per "
            "minute, backlog, latency). acme's container page draws its children on a "
            "timeline, the critical path outlined."
        )
        problems = []
        if ended < ran:
            problems.append(f"the charts' figures count {ended} ended attempts for {ran} jobs")
        if "jq-timeline" not in str(
            timeline.render(Job.objects.get(pk=cast.containers["acme"].pk))
        ):
            problems.append("acme's workflow has no timeline")
        return problems

    def summary(self, cast: Cast) -> list[str]:
        """Print jobs by state, by type and the fair share; return what went wrong."""
        jobs = list(Job.objects.order_by("pk"))
        by_state = Table(title="Jobs by state", title_justify="left")
        by_state.add_column("state")
        by_state.add_column("jobs", justify="right")
        by_state.add_column("of which containers", justify="right")
        for state in Job.State:
            n = sum(job.state == state for job in jobs)
            if n:
                boxes = sum(job.state == state and job.is_container for job in jobs)
                by_state.add_row(str(state), str(n), str(boxes or ""))
        self.console.print(by_state)

        by_type = Table(title="Jobs by type (run time of the last attempt)", title_justify="left")
        for column in ("type", "jobs", "states", "attempts"):
            by_type.add_column(column, justify="left" if column in ("type", "states") else "right")
        by_type.add_column("mean", justify="right")
        by_type.add_column("max", justify="right")
        for type_ in dict.fromkeys(job.type for job in jobs if not job.is_container):
            group = [job for job in jobs if job.type == type_]
            states = ", ".join(f"{n} {s}" for s, n in _count(job.state for job in group).items())
            runs = [_seconds(job) for job in group if job.started_at and job.finished_at]
            mean = f"{statistics.mean(runs):.2f} s" if runs else "-"
            longest = f"{max(runs):.2f} s" if runs else "-"
            attempts = str(sum(job.attempts for job in group))
            by_type.add_row(type_, str(len(group)), states, attempts, mean, longest)
        self.console.print(by_type)

        share = fair_share(jobs)
        acme, globex = share["acme"], share["globex"]
        ratio = acme / globex if globex else float("inf")
        self.console.print(
            f"Fair share: until acme's last product sync started, acme had started {acme} of "
            f"them and globex {globex}: {ratio:.1f} : 1 for weights 3 : 1 (the ops jobs took "
            "slots too)."
        )
        return check(cast, jobs, ratio)


def enqueue_story(products: int) -> Cast:
    """Write every job of the story in one transaction, as an application would."""
    with transaction.atomic():
        containers, publish = {}, {}
        for tenant, weight in TENANTS.items():
            with jobqueue.container(f"catalogue-{tenant}", group=tenant) as batch:
                for index in range(products):
                    sku = f"{tenant[:3].upper()}-{index + 1:03d}"
                    ms = 200 + (index * 37) % 150  # 200-349 ms, the same on every run
                    jobqueue.enqueue(
                        "shop.sync_product",
                        {"tenant": tenant, "sku": sku, "ms": ms},
                        parent=batch,
                        group=tenant,
                        weight=weight,
                    )
            containers[tenant] = batch
            publish[tenant] = jobqueue.enqueue(
                "shop.publish_catalogue",
                {"tenant": tenant},
                depends_on=[batch],
                group=tenant,
                weight=weight,
            )
        rates = jobqueue.enqueue("shop.fetch_rates", {"currency": "USD"}, group=OPS)
        order = Order.objects.create(number="ORD-0001", total=Decimal("42.00"))  # unpaid
        ship = jobqueue.enqueue("shop.ship_order", {"order_id": order.pk}, group=OPS)
        # A Django task (shop/tasks.py) in the same workflow: its job depends on ship_order's.
        sent = email_tracking.using(depends_on=[ship], group=OPS).enqueue(order_id=order.pk)
        # Left for the admin: an order nobody pays (its job stays dead) and next month's
        # report, which waits for an approval nobody sends.
        unpaid_order = Order.objects.create(number="ORD-0002", total=Decimal("17.50"))
        unpaid = jobqueue.enqueue("shop.ship_order", {"order_id": unpaid_order.pk}, group=OPS)
        next_report = jobqueue.enqueue(
            "shop.monthly_report", {"month": NEXT_MONTH, "pages": 2}, group=OPS, max_attempts=1
        )
        email = Job.objects.get(pk=int(sent.id))
        search = jobqueue.enqueue("shop.rebuild_search", {"batches": 300}, group=OPS)
        report = jobqueue.enqueue(
            "shop.monthly_report", {"month": REPORT_MONTH, "pages": REPORT_PAGES}, group=OPS,
            max_attempts=1,
        )  # fmt: skip
        reviews = jobqueue.enqueue(
            "shop.summarize_reviews", {"tenant": "acme", "reviews": REVIEWS}, group=OPS,
            max_attempts=1,
        )  # fmt: skip
    return Cast(
        containers, publish, rates, ship, email, search, order, report, reviews, unpaid,
        next_report,
    )  # fmt: skip


def note(role: str, state: str, attempts: int) -> str:
    """What a change of state of one of the followed jobs means; '' for nothing to tell."""
    notes = {
        ("rates", "scheduled"): "waits for its retry (scheduled, after the backoff)",
        ("rates", "done"): f"done on attempt {attempts}",
        ("ship", "dead"): "is [red]dead[/]: Fail means no retries",
        ("ship", "done"): f"done on attempt {attempts}",
        ("email", "cancelled"): "is [yellow]cancelled[/]: its upstream job is dead",
        ("email", "done"): "done: the tracking email is out",
        ("search", "running"): "is running",
        ("search", "cancelled"): "is [yellow]cancelled[/]: the handler stopped early",
        ("report", "waiting"): "fetched its pages and waits for approval: no thread, no lease",
        ("report", "done"): "done: approved and published, with one attempt",
        ("reviews", "done"): "done: each call's tokens taken, then settled by what it used",
        ("unpaid", "dead"): "is [red]dead[/]: nobody pays ORD-0002 (left for the admin)",
        ("next_report", "waiting"): "waits for its approval: nobody sends it (left for the admin)",
    }
    kind, _, tenant = role.partition(":")
    if kind == "container":
        done = state == Job.State.DONE
        return f"({tenant}) rolled up [green]done[/]: all its children are done" if done else ""
    if kind == "publish":
        return {
            "ready": f"({tenant}) is ready: the container it depends on is done",
            "done": f"({tenant}) done: {tenant}'s catalogue is published",
        }.get(state, "")
    return notes.get((role, state), "")


def fair_share(jobs: list[Job]) -> dict[str, int]:
    """Product syncs each tenant had started when the first tenant's last one started."""
    starts = {
        tenant: sorted(
            job.started_at
            for job in jobs
            if job.type == "shop.sync_product" and job.group_key == tenant and job.started_at
        )
        for tenant in TENANTS
    }
    if not all(starts.values()):
        return dict.fromkeys(TENANTS, 0)
    cut = min(times[-1] for times in starts.values())
    return {tenant: sum(t <= cut for t in times) for tenant, times in starts.items()}


def check(cast: Cast, jobs: list[Job], ratio: float) -> list[str]:
    """The story's expectations; each one that failed, in words."""
    by_pk = {int(job.pk): job for job in jobs}

    def get(job: Job) -> Job:
        return by_pk[int(job.pk)]

    problems = []
    undone = [f"#{job.pk} {job.state}" for job in jobs if job.state != Job.State.DONE]
    told = [
        f"#{cast.unpaid.pk} dead",
        f"#{cast.search.pk} cancelled",
        f"#{cast.next_report.pk} waiting",
    ]
    if sorted(undone) != sorted(told):
        problems.append(f"all jobs but {told} should be done: not so {undone}")
    if get(cast.rates).attempts != 2:
        problems.append(f"fetch_rates took {get(cast.rates).attempts} attempts, not 2")
    if get(cast.ship).attempts != 2 or len(get(cast.ship).errors) != 1:
        problems.append("ship_order should have failed once and succeeded after retry()")
    if not get(cast.email).type.startswith("task:"):  # the story's Django task
        problems.append(f"email_tracking should be a Django task's job, not {cast.email.type}")
    if (get(cast.email).last_error or {}).get("type", "").rpartition(".")[2] != "UpstreamFailed":
        problems.append("email_tracking should keep its cancellation (UpstreamFailed) as history")
    if get(cast.search).state != Job.State.CANCELLED:
        problems.append(f"rebuild_search is {get(cast.search).state}, not cancelled")
    report = get(cast.report)
    expected = {"month": REPORT_MONTH, "rows": sum(10 + p for p in range(1, REPORT_PAGES + 1)),
                "approved_by": "the manager"}  # fmt: skip
    if (report.state, report.attempts, report.result) != (Job.State.DONE, 1, expected):
        problems.append(f"monthly_report is {report.state} ({report.result}), not {expected}")
    if report.handler_version != "1":
        problems.append(f"monthly_report ran under version {report.handler_version!r}, not '1'")
    fetches = JobStep.objects.filter(job_id=report.pk, name="fetch").count()
    if fetches != REPORT_PAGES:
        problems.append(f"monthly_report recorded {fetches} fetches, not {REPORT_PAGES}")
    problems += check_reviews(get(cast.reviews))
    if not 2.0 <= ratio <= 4.5:
        problems.append(f"acme got {ratio:.1f} times globex's slots, not about 3")
    return problems


def check_reviews(job: Job) -> list[str]:
    """shop.summarize_reviews: done once, each call a step, each grant settled by its use."""
    tokens = sum(300 + 40 * review for review in range(1, REVIEWS + 1))
    expected = {"tenant": "acme", "reviews": REVIEWS, "tokens": tokens}
    if (job.state, job.attempts, job.result) != (Job.State.DONE, 1, expected):
        return [f"summarize_reviews is {job.state} ({job.result}), not {expected}"]
    records = _count(JobStep.objects.filter(job_id=job.pk).values_list("name", flat=True))
    if [records.get(name) for name in ("@acquire", "summarize", "@settle")] != [REVIEWS] * 3:
        return [f"summarize_reviews recorded {records}, not {REVIEWS} of each call"]
    window = ResourceStart.objects.filter(resource="llm-tokens:acme").aggregate(n=Sum("units"))
    if window["n"] != tokens:
        return [f"acme's token budget counts {window['n']} tokens, not the {tokens} used"]
    return []


def write_svg(job: Job, path: Path, port: int = PORT) -> Path:
    """Write the admin's picture of `job`'s neighbourhood as a standalone SVG file."""
    site = f"http://127.0.0.1:{port}"
    svg = str(render(job)).replace('href="/', f'href="{site}/')  # links open the demo site
    path.write_text('<?xml version="1.0" encoding="UTF-8"?>\n' + svg + "\n", encoding="utf-8")
    return path


def _count(values: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[str(value)] = counts.get(str(value), 0) + 1
    return counts


def _seconds(job: Job) -> float:
    assert job.started_at and job.finished_at
    return (job.finished_at - job.started_at).total_seconds()
