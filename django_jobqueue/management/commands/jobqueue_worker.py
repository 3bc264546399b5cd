"""manage.py jobqueue_worker: run a worker process."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, InterfaceError
from django.utils import autoreload

from django_jobqueue import conf
from django_jobqueue.conf import MAX_INTERVAL
from django_jobqueue.exceptions import InvalidJobError, UnsupportedDatabaseError
from django_jobqueue.validation import check_label, finite, name_problem
from django_jobqueue.worker import JobWorker, WorkerOptions
from django_jobqueue.worker.watchdog import Guard


def _positive(kind: type, maximum: float | None = None) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not finite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be positive and finite")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(
                f"{text!r} is over {maximum:,.0f} seconds (about 11.6 days)"
            )
        return value

    return parse


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not finite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must not be negative (and finite)")
    if value > MAX_INTERVAL:
        raise argparse.ArgumentTypeError(
            f"{text!r} is over {MAX_INTERVAL:,.0f} seconds (about 11.6 days)"
        )
    return value


def _worker_id(text: str) -> str:
    # Stored in Worker.id and Job.lease_owner, both 255 characters; printed in logs and by
    # jobqueue_stats. A byte of argv that is not UTF-8 arrives as a lone surrogate.
    problem = name_problem(text, 255)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def _queue(text: str) -> str:
    # A queue name as enqueue() takes it (the queue column, 100 characters): a worker given one
    # no job can have would claim nothing, and its name is printed in the start-up line.
    try:
        return check_label("queue", text, 100)
    except InvalidJobError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must not be negative")
    return value


class Command(BaseCommand):
    help = (
        "Run a job queue worker: reclaim expired leases, claim ready jobs, run their handlers "
        "and record the outcomes, until stopped by SIGTERM/SIGINT (or by --burst/--max-jobs)."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--concurrency",
            type=_positive(int),
            default=1,
            help="Jobs in flight at once in this process, each in a thread (default: 1).",
        )
        parser.add_argument(
            "--queue",
            action="append",
            type=_queue,
            dest="queues",
            default=[],
            metavar="NAME",
            help="Only claim jobs from this queue; repeat for several (default: all queues).",
        )
        parser.add_argument(
            "--poll-interval",
            type=_positive(float, MAX_INTERVAL),
            metavar="SECONDS",
            help="Seconds to wait between polls when idle, +-20%% jitter "
            "(default: JOBQUEUE['POLL_INTERVAL'], 1.0).",
        )
        parser.add_argument(
            "--lease-ttl",
            type=_positive(float, MAX_INTERVAL),
            metavar="SECONDS",
            help="Seconds a claim stays valid without a heartbeat; another "
            "worker reclaims it after (default: JOBQUEUE['LEASE_TTL'], 30).",
        )
        parser.add_argument(
            "--heartbeat-interval",
            type=_positive(float, MAX_INTERVAL),
            metavar="SECONDS",
            help="Seconds between lease renewals, at most half the lease TTL "
            "(default: JOBQUEUE['HEARTBEAT_INTERVAL'], 10).",
        )
        parser.add_argument(
            "--shutdown-timeout",
            type=_non_negative,
            metavar="SECONDS",
            help="On SIGTERM/SIGINT, seconds to let in-flight jobs finish "
            "before releasing them back to ready "
            "(default: JOBQUEUE['SHUTDOWN_TIMEOUT'], 30).",
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="Exit with status 0 once nothing is runnable and nothing is "
            "in flight (for scripts, tests and cron).",
        )
        parser.add_argument(
            "--max-jobs",
            type=_positive(int),
            metavar="N",
            help="Exit after claiming N jobs and finishing them.",
        )
        parser.add_argument(
            "--prefetch",
            type=_non_negative_int,
            metavar="N",
            help="Claim up to N jobs beyond the free threads while recent jobs are short "
            "enough to start within milliseconds; 0 claims only for free threads "
            "(default: JOBQUEUE['PREFETCH'], 128).",
        )
        parser.add_argument(
            "--worker-id",
            type=_worker_id,
            metavar="NAME",
            help="This worker's lease owner name (default: host:pid:random).",
        )
        parser.add_argument(
            "--reload",
            action="store_true",
            help="Restart the worker when Python code changes, with Django's autoreloader "
            "(as runserver does). For development: a restart does not wait for running jobs.",
        )
        parser.add_argument(
            "--no-watchdog",
            action="store_true",
            help="Run without the watchdog process that kills this worker when a handler "
            "freezes it (holds the GIL) for longer than its leases allow.",
        )

    def execute(self, *args: Any, **options: Any) -> Any:
        # The system checks, before handle(), connect to the database too.
        try:
            return super().execute(*args, **options)
        except (DatabaseError, InterfaceError) as exc:
            raise _cannot_connect(exc) from exc

    def handle(self, *args: Any, **options: Any) -> None:
        _ensure_logging(options["verbosity"])
        opts = WorkerOptions(
            concurrency=options["concurrency"],
            queues=options["queues"],
            poll_interval=options["poll_interval"],
            lease_ttl=options["lease_ttl"],
            heartbeat_interval=options["heartbeat_interval"],
            shutdown_timeout=options["shutdown_timeout"],
            burst=options["burst"],
            max_jobs=options["max_jobs"],
            worker_id=options["worker_id"],
            prefetch=options["prefetch"],
        )
        try:
            worker = JobWorker(opts)
        except (ValueError, UnsupportedDatabaseError) as exc:
            raise CommandError(str(exc)) from exc
        if options["reload"]:
            # The reloader runs the worker in a thread of a child process and restarts that
            # process when a module's file changes; signals stay with the reloader.
            autoreload.run_with_reloader(self._run_reloaded, opts)
            return
        guard = None if options["no_watchdog"] else _start_watchdog(worker)
        try:
            code = self._run(worker, install_signals=True)
        finally:
            if guard is not None:
                guard.stop()
        if code:
            sys.exit(code)

    def _run(self, worker: JobWorker, *, install_signals: bool) -> int:
        try:
            return worker.run(install_signals=install_signals)
        except (ValueError, UnsupportedDatabaseError) as exc:
            raise CommandError(str(exc)) from exc
        except (DatabaseError, InterfaceError) as exc:
            raise _cannot_connect(exc) from exc

    def _run_reloaded(self, opts: WorkerOptions) -> None:
        code = self._run(JobWorker(opts), install_signals=False)
        if code:
            os._exit(code)  # the reloader's main thread would not see sys.exit() here


def _start_watchdog(worker: JobWorker) -> Guard:
    """Start the process that kills `worker` if it freezes (see django_jobqueue/watchdog.py)."""
    guard = Guard(worker_id=worker.worker_id, lease_ttl=worker.lease_ttl)
    worker.on_beat = guard.beaten
    guard.start()
    return guard


def _ensure_logging(verbosity: int) -> None:
    """Show the worker's log lines on stderr unless the project configured logging for them."""
    logger = logging.getLogger("django_jobqueue")
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING if verbosity == 0 else logging.INFO)
    if verbosity >= 2:
        logger.setLevel(logging.DEBUG)


def _cannot_connect(exc: BaseException) -> CommandError:
    """The one-line error of a worker that cannot reach its database (down, refused, full).

    No traceback, and a non-zero exit: a supervisor restarts the worker.
    """
    reason = " ".join(str(exc).split()) or type(exc).__name__
    return CommandError(f"Cannot connect to database {conf.get().database!r}: {reason}")
