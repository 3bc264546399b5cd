"""record_effect(): the inbox that makes a handler's own database writes happen once.

Delivery is at least once: a handler whose worker died after its writes committed (but before
the job's outcome was recorded) runs again. Recording a key in the same transaction as those
writes lets the second run see that they happened.
"""

from __future__ import annotations

from django.db import IntegrityError, connections, transaction

from . import validation
from .exceptions import JobQueueError
from .models import Effect


def record_effect(key: str, *, using: str | None = None) -> bool:
    """Record effect `key` in the caller's open transaction; False if it was recorded before.

    Call it inside ``transaction.atomic()``, with the writes it guards, on the database that
    holds them (`using`; by default the one alias with an open transaction). When it returns
    True, make the writes: they commit or roll back together with the record. When it returns
    False, an earlier run committed them: skip them. A second run racing the first waits for
    the first's commit on the unique key, then gets False. It cannot cover a remote call (an
    e-mail, an HTTP request): nothing can roll that back or make it part of the transaction.
    """
    # An application's own key, never printed by the commands: any text goes.
    validation.check_label("effect key", key, 255, allow_control=True)
    alias = using if using is not None else _open_alias()
    if not connections[alias].in_atomic_block:
        raise JobQueueError(
            f"record_effect() must run inside transaction.atomic(using={alias!r}), with the "
            "writes it guards: on its own it would commit at once."
        )
    try:
        with transaction.atomic(using=alias):  # a savepoint: the duplicate leaves it usable
            Effect.objects.using(alias).create(key=key)
    except IntegrityError:
        return False
    return True


def _open_alias() -> str:
    open_ = [alias for alias in connections if connections[alias].in_atomic_block]
    if len(open_) != 1:
        raise JobQueueError(
            "record_effect() must run inside exactly one open transaction.atomic(); "
            f"pass using= to say which database holds the writes (open now: {open_ or 'none'})."
        )
    return open_[0]
