"""Events for waiting jobs: `send_event()` and `asend_event()`.

The documented import path; the code is in `engine/events.py`.
"""

from .engine.events import asend_event, send_event

__all__ = ["asend_event", "send_event"]
