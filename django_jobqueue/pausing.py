"""Queue pause: workers claim no job of a paused queue until it is resumed.

The state lives in QueueState rows. Each worker reads the paused queues at most every
FAIR_SHARE_REFRESH seconds (see FairShare.paused_queues) and leaves them out of its claim, so
a pause takes effect within about that long; jobs already running finish as usual.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from . import conf, validation
from .models import QueueState


def pause_queue(name: str) -> bool:
    """Pause queue `name`; return False when it was paused already."""
    validation.check_label("queue", name, 100)
    using = conf.get().database
    states = QueueState.objects.using(using)
    with transaction.atomic(using=using):
        if states.filter(name=name, paused=False).update(paused=True, paused_at=timezone.now()):
            return True
        if states.filter(name=name).exists():
            return False
        created = states.bulk_create(
            [QueueState(name=name, paused=True, paused_at=timezone.now())],
            ignore_conflicts=True,
        )
        return bool(created)


def resume_queue(name: str) -> bool:
    """Resume queue `name`; return False when it was not paused."""
    validation.check_label("queue", name, 100)
    using = conf.get().database
    return bool(
        QueueState.objects.using(using)
        .filter(name=name, paused=True)
        .update(paused=False, paused_at=None)
    )


def paused_queues(using: str | None = None) -> tuple[str, ...]:
    """Return the names of the paused queues, sorted."""
    return tuple(
        QueueState.objects.using(using or conf.get().database)
        .filter(paused=True)
        .order_by("name")
        .values_list("name", flat=True)
    )
