"""A row held by another transaction, as an operator's session or a stalled claim holds it."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from django.db import connections, transaction


@contextlib.contextmanager
def holding(model: Any, **lookup: Any) -> Iterator[None]:
    """Lock the rows of `model` that `lookup` selects FOR UPDATE, in a transaction of another
    connection (on a thread), for as long as the block runs."""
    held, let_go, failed = threading.Event(), threading.Event(), []

    def run() -> None:
        try:
            with transaction.atomic():
                rows = list(model.objects.select_for_update().filter(**lookup))
                if not rows:
                    raise AssertionError(f"no {model.__name__} row {lookup}")
                held.set()
                let_go.wait(60)
        except BaseException as exc:  # reported by the test's thread
            failed.append(exc)
        finally:
            held.set()
            connections.close_all()

    thread = threading.Thread(target=run, name="holder")
    thread.start()
    try:
        assert held.wait(60) and not failed, failed
        yield
    finally:
        let_go.set()
        thread.join(60)
