"""Events that suspended jobs wait for: send_event(), and waking the jobs that wait.

An event is a key and a payload; the first payload sent for a key is kept, and a job that
starts waiting after it was sent gets it at once. A job waits (`ctx.wait_for_event`) in state
`waiting` with a JobWait row naming the key and, with a timeout, the time it gives up. The
sender and a job starting to wait both lock the key's JobEvent row (a placeholder with no
payload until something is sent), so that one always sees the other: a wait never misses an
event sent while it was being recorded.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.db import IntegrityError, transaction

from .. import conf, validation
from ..dialects import Dialect, get_dialect
from ..exceptions import InvalidArgumentsError
from ..models import Job, JobEvent, JobWait
from ..models.functions import DbNow
from . import workflows


def send_event(key: str, payload: Any = None) -> bool:
    """Send event `key` with `payload` (JSON), waking every job that waits for it.

    Written in the caller's transaction on the queue database, as `enqueue()` is: a send
    that rolls back wakes nothing. The first payload sent for a key is kept: a job waiting
    later gets it at once, and sending the key again changes nothing (it returns False).

    Raises:
        InvalidJobError: `key` is not a name of 1 to 255 printable characters, or `payload`
            is not JSON (`InvalidArgumentsError`). Nothing was written.
    """
    settings = conf.get()
    validation.check_label("event key", key, 255)
    problem = validation.json_problem(payload, "the payload", settings.max_args_bytes)
    if problem:
        raise InvalidArgumentsError(f"event {key!r}: {problem}")
    dialect = get_dialect(settings.database)

    def txn() -> bool:
        sent = lock_event(dialect, key)
        if sent:
            return False
        events = JobEvent.objects.using(dialect.using)
        events.filter(key=key).update(payload=payload, sent_at=DbNow())
        wake(dialect, list(JobWait.objects.using(dialect.using).filter(key=key)
                           .values_list("job_id", flat=True)))  # fmt: skip
        return True

    return dialect.run_in_caller_transaction(txn)


async def asend_event(key: str, payload: Any = None) -> bool:
    """The async twin of `send_event()`: the same arguments, checks, errors and result.

    It runs `send_event()` through ``sync_to_async`` (thread-sensitive), so it joins a
    transaction opened on that thread, as `aenqueue()` does.
    """
    return await sync_to_async(send_event)(key, payload)


def lock_event(dialect: Dialect, key: str) -> bool:
    """Lock event `key`'s row, making a placeholder if there is none; return whether it was
    sent. Whoever sends the event or starts to wait for it calls this first."""
    events = JobEvent.objects.using(dialect.using)
    if not events.filter(key=key).exists():
        try:
            with transaction.atomic(using=dialect.using):  # a concurrent insert may win
                events.create(key=key)
        except IntegrityError:
            pass
    row = dialect.lock_blocking(events.filter(key=key)).values_list("sent_at", flat=True)
    return row.first() is not None


def sent_payload(dialect: Dialect, key: str) -> tuple[bool, Any]:
    """(whether event `key` was sent, its payload)."""
    row = (
        JobEvent.objects.using(dialect.using)
        .filter(key=key, sent_at__isnull=False)
        .values_list("payload", flat=True)
    )
    for payload in row:
        return True, payload
    return False, None


def wake(dialect: Dialect, job_ids: list[int]) -> int:
    """Make the waiting jobs `job_ids` ready (they resume) and drop their waits."""
    if not job_ids:
        return 0
    jobs = Job.objects.using(dialect.using)
    waiting = dialect.lock_blocking(
        jobs.filter(pk__in=sorted(job_ids), state=Job.State.WAITING).order_by("pk")
    )
    ids = list(waiting.values_list("pk", flat=True))
    JobWait.objects.using(dialect.using).filter(job_id__in=sorted(job_ids)).delete()
    if not ids:
        return 0
    queues = set(jobs.filter(pk__in=ids).values_list("queue", flat=True))
    woken = jobs.filter(pk__in=ids).update(state=Job.State.READY, updated_at=DbNow())
    workflows.notify_on_commit(dialect, queues)
    return woken


def expire_waits(dialect: Dialect, *, batch: int) -> int:
    """Wake up to `batch` jobs whose wait for an event timed out (database clock)."""

    def txn() -> int:
        due = dialect.lock(
            JobWait.objects.using(dialect.using).filter(until__lte=DbNow()).order_by("until")
        )
        return wake(dialect, list(due.values_list("job_id", flat=True)[:batch]))

    return dialect.run_in_transaction(txn)
