"""manage.py jobqueue_limits: what each limit of JOBQUEUE["LIMITS"] holds, and live changes."""

from __future__ import annotations

import argparse
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_jobqueue import conf, validation
from django_jobqueue.dialects import get_dialect
from django_jobqueue.engine import occupancy
from django_jobqueue.exceptions import InvalidJobError


class Command(BaseCommand):
    help = (
        "List every limit (JOBQUEUE['LIMITS'], and the groups and queues of GROUP_LIMITS, "
        "RATE_LIMITS and QUEUE_LIMITS) with what it holds now (units in flight; for a rate, the "
        "units granted in its window, those settled, and what the rate counts; closed until) "
        "and the ready jobs waiting for it; 'set' changes "
        "a limit and 'reset' goes back to the settings, both applied by running workers "
        "within 2 seconds."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print one JSON object.")
        actions = parser.add_subparsers(dest="action", metavar="{set,reset}")
        change = actions.add_parser("set", help="Change a limit while workers run.")
        change.add_argument("name", help="A LIMITS entry ('openai', 'tenant:*') or a resource.")
        change.add_argument("--concurrency", type=int, metavar="N", help="Units in flight.")
        change.add_argument("--rate", metavar="N/P", help="Units started per s, m or h.")
        back = actions.add_parser("reset", help="Go back to the settings' value of a limit.")
        back.add_argument("name")

    def handle(self, *args: Any, **options: Any) -> None:
        dialect = get_dialect(conf.get().database)
        action = options.get("action")
        if action == "set":
            name = self._name(options["name"])
            if options["concurrency"] is None and options["rate"] is None:
                raise CommandError("Give --concurrency N, --rate N/P, or both.")
            try:
                occupancy.set_limit(
                    dialect, name, concurrency=options["concurrency"], rate=options["rate"]
                )
            except InvalidJobError as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(f"Limit {name!r} changed; running workers apply it within 2 s.")
            return
        if action == "reset":
            name = self._name(options["name"])
            try:
                changed = occupancy.reset_limit(dialect, name)
            except InvalidJobError as exc:
                raise CommandError(str(exc)) from None
            if changed:
                self.stdout.write(f"Limit {name!r} is back to its settings' value.")
            else:
                self.stdout.write(f"Limit {name!r} was not changed.")
            return
        entries = occupancy.occupancy(dialect)
        if options["json"]:
            self.stdout.write(json.dumps({"limits": entries}))
            return
        if not entries:
            self.stdout.write("No limits: JOBQUEUE['LIMITS'] is empty and no resource was used.")
            return
        header = ("resource", "limit", "concurrency", "in flight", "rate", "granted", "settled",
                  "started", "closed until", "waiting")  # fmt: skip
        rows = [header]
        for e in entries:
            rows.append(
                (
                    validation.printable(e["name"]),
                    validation.printable(e["limit"] or "-")
                    + (" (changed)" if e["changed"] else ""),
                    "-" if e["concurrency"] is None else str(e["concurrency"]),
                    str(e["in_flight"]),
                    e["rate"] or "-",
                    "-" if e["granted_in_window"] is None else str(e["granted_in_window"]),
                    "-" if e["settled_in_window"] is None else str(e["settled_in_window"]),
                    "-" if e["started_in_window"] is None else str(e["started_in_window"]),
                    e["closed_until"] or "-",
                    str(e["waiting"]),
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        for row in rows:
            self.stdout.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))

    @staticmethod
    def _name(name: str) -> str:
        try:
            return occupancy.check_name(name)
        except InvalidJobError as exc:
            raise CommandError(str(exc)) from None
