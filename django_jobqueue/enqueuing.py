"""Enqueueing one job: `enqueue()` and `aenqueue()`.

The documented import path; the code is in `engine/enqueuing.py`.
"""

from .engine.enqueuing import JobRef, aenqueue, enqueue

__all__ = ["JobRef", "aenqueue", "enqueue"]
