"""manage.py jobqueue_stats: the queue's figures, as text or JSON, once or refreshed; a probe."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_jobqueue import conf, stats, validation
from django_jobqueue.conf import MAX_INTERVAL
from django_jobqueue.dialects import get_dialect

MAX_MINUTES = 366 * 24 * 60  # --minutes: a year at most (a window of the per-minute counts)
CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear screen: --watch redraws in place


class Command(BaseCommand):
    help = (
        "Print counts by state, queue and group, the oldest ready job's age, leases, workers, "
        "unserved queues and recent throughput. --check exits 1 when the queue is unhealthy."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print one JSON object.")
        parser.add_argument(
            "--watch",
            nargs="?",
            const="2",
            metavar="SECONDS",
            help="Refresh in place every SECONDS (default 2) until interrupted.",
        )
        parser.add_argument(
            "--check",
            action="store_true",
            help="Exit 1 when the queue is unhealthy: a queue with ready jobs and no live "
            "worker for it, the oldest ready job older than --max-age, leases expired "
            "past a lease TTL beyond --max-expired, or an open container idle past "
            "--max-open-idle.",
        )
        parser.add_argument(
            "--max-age",
            default=str(stats.DEFAULT_MAX_AGE),
            metavar="SECONDS",
            help=f"Oldest ready job's age that is unhealthy (default {stats.DEFAULT_MAX_AGE:g}).",
        )
        parser.add_argument(
            "--max-expired",
            default=str(stats.DEFAULT_MAX_EXPIRED),
            metavar="N",
            help="Leases left expired past a lease TTL that are tolerated (default "
            f"{stats.DEFAULT_MAX_EXPIRED}).",
        )
        parser.add_argument(
            "--max-open-idle",
            default=str(stats.DEFAULT_MAX_OPEN_IDLE),
            metavar="SECONDS",
            help="Seconds an open (unsealed) container may go without a write or a new child "
            f"before it is unhealthy (default {stats.DEFAULT_MAX_OPEN_IDLE:g}).",
        )
        parser.add_argument(
            "--minutes",
            default=str(stats.DEFAULT_MINUTES),
            metavar="N",
            help=f"Throughput window in minutes (default {stats.DEFAULT_MINUTES}).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        thresholds = stats.Thresholds(
            max_age=_number("--max-age", options["max_age"], float, minimum=0),
            max_expired=_number("--max-expired", options["max_expired"], int, minimum=0),
            max_open_idle=_number("--max-open-idle", options["max_open_idle"], float, minimum=0),
        )
        minutes = _number("--minutes", options["minutes"], int, minimum=1, maximum=MAX_MINUTES)
        watch = (
            None
            if options["watch"] is None
            else _number("--watch", options["watch"], float, minimum=0.1, maximum=MAX_INTERVAL)
        )
        if watch is not None and options["check"]:
            raise CommandError("--watch and --check do not go together.")
        settings = conf.get()
        dialect = get_dialect(settings.database)

        def snapshot() -> dict[str, Any]:
            return stats.collect(
                dialect, lease_ttl=settings.lease_ttl, minutes=minutes, thresholds=thresholds
            )

        if watch is None:
            figures = snapshot()
            self._show(figures, as_json=options["json"])
            if options["check"] and figures["problems"]:
                sys.exit(1)  # a probe reads the status; the reasons were printed
            return
        try:
            while True:
                figures = snapshot()
                if not options["json"]:  # JSON: one object per line, for a pipe
                    self.stdout.write(CLEAR, ending="")
                self._show(figures, as_json=options["json"])
                self.stdout.flush()
                time.sleep(watch)
        except KeyboardInterrupt:
            return

    def _show(self, figures: dict[str, Any], *, as_json: bool) -> None:
        if as_json:
            self.stdout.write(json.dumps(figures, sort_keys=False))
            return
        self.stdout.write("\n".join(render(figures)))


def render(figures: dict[str, Any]) -> list[str]:
    """The figures as lines of text."""
    lines = [f"Job queue at {figures['time']}", "", "States:"]
    lines += [f"  {state:<10} {n:>10}" for state, n in figures["states"].items()]
    for title, key in (("Queues", "queues"), ("Groups", "groups")):
        rows = figures[key]
        if rows:
            names = list(next(iter(rows.values())))
            lines += ["", f"{title} (unfinished jobs): " + " ".join(f"{n:>9}" for n in names)]
            for name, counts in rows.items():
                label = name or "(none)"
                lines.append(f"  {label:<24} " + " ".join(f"{counts[n]:>9}" for n in names))
    age = figures["oldest_ready_age"]
    leases, workers = figures["leases"], figures["workers"]
    throughput = figures["throughput"]
    lines += [
        "",
        "Oldest ready job: " + ("none ready" if age is None else f"waiting {age:.1f}s"),
        f"Leases: {leases['in_flight']} in flight; {leases['expired']} ran out and await a "
        f"reclaimer, {leases['expired_stale']} of them for over a lease TTL",
        f"Workers: {workers['live']} live, {workers['stale']} stale, "
        f"{workers['gone']} gone (kept an hour)",
        f"Throughput: {throughput['finished_per_minute']} finished/min over the last "
        f"{throughput['minutes']} min",
    ]
    for minute, counts in throughput["per_minute"].items():
        lines.append(f"  {minute}  " + "  ".join(f"{s} {n}" for s, n in counts.items()))
    opened = figures["open_containers"]
    if opened["open"]:
        lines.append(
            f"Open containers: {opened['open']} not sealed (oldest opened "
            f"{opened['oldest_age']:.0f}s ago), {opened['idle']} idle past the threshold"
            + (": " + ", ".join(str(pk) for pk in opened["idle_ids"]) if opened["idle"] else "")
        )
    chains = figures["sequences"]
    if chains["active"]:
        lines.append(
            f"Sequences: {chains['active']} active, {chains['blocked']} blocked"
            + (
                ": " + ", ".join(f"{k} at job {pk}" for k, pk in chains["blocked_heads"].items())
                if chains["blocked"]
                else ""
            )
        )
    if figures["closed_resources"]:
        lines.append(
            "Closed by RateLimited: "
            + ", ".join(f"{n} until {t}" for n, t in figures["closed_resources"].items())
        )
    if figures["unserved_queues"]:
        lines.append("Ready jobs no live worker serves: " + _pairs(figures["unserved_queues"]))
    unknown = figures["unknown_handlers"]
    if unknown:
        # They wait, by design: a rolling deploy's newer release may define them.
        whom = "no live worker has" if figures["workers"]["live"] else "no code here registers"
        lines.append(
            f"{sum(unknown.values())} ready or scheduled job(s) wait for a handler {whom}: "
            + _pairs(unknown)
        )
    waiting = figures["unserved_versions"]
    if waiting:
        # They wait, by design: a worker that has their version (an older one) may come back.
        whom = "no live worker has" if figures["workers"]["live"] else "no code here registers"
        counts = {
            f"{kind}@{v or '(none)'}": n for kind, by in waiting.items() for v, n in by.items()
        }
        lines.append(
            f"{sum(counts.values())} started job(s) wait for a handler version {whom}: "
            + _pairs(counts)
        )
    lines.append("")
    if figures["problems"]:
        lines += ["UNHEALTHY:"] + [f"  - {p}" for p in figures["problems"]]
    else:
        lines.append("Healthy.")
    # Names come from the database: one holding ESC or CR (stored before enqueue refused
    # them) must not drive the operator's terminal.
    return [validation.printable(line) for line in lines]


def _pairs(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} ({n})" for name, n in counts.items())


def _number(
    option: str, text: str, kind: type, *, minimum: float = 0.0, maximum: float | None = None
) -> Any:
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise CommandError(f"{option}: {text!r} is not a number.") from None
    if value < minimum or (kind is float and value != value):
        raise CommandError(f"{option} must be at least {minimum:g}.")
    if maximum is not None and value > maximum:
        raise CommandError(f"{option} must be at most {maximum:,.10g}.")
    return value
