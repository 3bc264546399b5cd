"""manage.py jobqueue_prune: delete old finished jobs in bounded batches."""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from django_jobqueue import conf, pruning
from django_jobqueue.dialects import get_dialect


class Command(BaseCommand):
    help = (
        "Delete finished jobs older than --older-than (default states: done and cancelled), "
        "in short transactions of --batch-size rows, keeping jobs that unfinished jobs need."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--older-than",
            metavar="AGE",
            help="Delete jobs finished longer ago than this: a number and a unit, s, m, h or "
            "d (7d). Default: the ages of JOBQUEUE['RETENTION'].",
        )
        parser.add_argument(
            "--state",
            action="append",
            dest="states",
            default=[],
            metavar="STATE",
            help="A final state to prune (done, cancelled, dead); repeat for several "
            "(default: done and cancelled; dead only when named).",
        )
        parser.add_argument(
            "--batch-size",
            default=str(pruning.DEFAULT_BATCH_SIZE),
            metavar="N",
            help=f"Rows per transaction, 1 to {pruning.MAX_BATCH_SIZE} "
            f"(default: {pruning.DEFAULT_BATCH_SIZE}).",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Count what would be deleted; delete nothing.",
        )
        parser.add_argument(
            "--tune-postgres",
            action="store_true",
            help="Instead of pruning, set autovacuum and fillfactor storage parameters on the "
            "queue tables (PostgreSQL only); with --dry-run, print the SQL.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        settings = conf.get()
        dialect = get_dialect(settings.database)
        if options["tune_postgres"]:
            self._tune(dialect, dry_run=options["dry_run"])
            return
        batch_size = _batch_size(options["batch_size"])
        ages = _ages(options["older_than"], options["states"], settings)
        mode = " (dry run: nothing is deleted)" if options["dry_run"] else ""
        self.stdout.write(
            "Pruning "
            + ", ".join(
                f"{state} jobs finished over {_human(age)} ago" for state, age in ages.items()
            )
            + f" in batches of {batch_size}{mode}"
        )

        def progress(batch: pruning.Batch) -> None:
            verb = "would delete" if options["dry_run"] else "deleted"
            kept = batch.needed + batch.containers
            self.stdout.write(
                f"  {batch.state}: {verb} {batch.deleted} of {batch.scanned}"
                + (f" ({kept} kept: still needed)" if kept else "")
            )

        report = pruning.prune(
            dialect, ages, batch_size=batch_size, dry_run=options["dry_run"], progress=progress
        )
        verb = "Would delete" if options["dry_run"] else "Deleted"
        per_state = ", ".join(f"{n} {state}" for state, n in report.deleted.items())
        kept = report.needed + report.containers
        self.stdout.write(
            self.style.SUCCESS(
                f"{verb} {report.total} job(s) ({per_state}) in {report.batches} batch(es); "
                f"{kept} kept because unfinished jobs still need them."
            )
        )

    def _tune(self, dialect: Any, *, dry_run: bool) -> None:
        statements = dialect.storage_tuning()
        if not statements:
            raise CommandError(
                f"--tune-postgres needs PostgreSQL; database {dialect.using!r} is {dialect.vendor}."
            )
        for sql in statements:
            self.stdout.write(sql + ";")
            if not dry_run:
                with connections[dialect.using].cursor() as cursor:
                    cursor.execute(sql)
        if not dry_run:
            self.stdout.write(self.style.SUCCESS("Storage parameters set."))


def _batch_size(text: str) -> int:
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise CommandError(f"--batch-size: {text!r} is not a whole number.") from None
    if not 1 <= value <= pruning.MAX_BATCH_SIZE:
        raise CommandError(f"--batch-size must be between 1 and {pruning.MAX_BATCH_SIZE}.")
    return value


def _ages(
    older_than: str | None, states: list[str], settings: conf.JobQueueSettings
) -> dict[str, dt.timedelta]:
    """The age to prune each chosen state at, from the options or JOBQUEUE['RETENTION']."""
    try:
        chosen = pruning.check_states(states)
    except ValueError as exc:
        raise CommandError(f"--state: {exc}") from None
    if older_than is not None:
        try:
            age = conf.parse_age(older_than)
        except ValueError as exc:
            raise CommandError(f"--older-than: {exc}") from None
        return {state: age for state in chosen or pruning.DEFAULT_STATES}
    retained = settings.retention_ages()
    if not retained:
        raise CommandError("Give --older-than (e.g. 7d), or set JOBQUEUE['RETENTION'].")
    ages = {s: age for s, age in retained.items() if not chosen or s in chosen}
    if not ages:
        raise CommandError(
            f"JOBQUEUE['RETENTION'] gives no age for {', '.join(chosen)}: give --older-than."
        )
    return ages


def _human(age: dt.timedelta) -> str:
    seconds = age.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
