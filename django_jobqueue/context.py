"""The context a handler receives (`ctx`): `JobContext` and `AsyncJobContext`.

The documented import path; the code is in `engine/context.py`.
"""

from .engine.context import AsyncJobContext, JobContext

__all__ = ["AsyncJobContext", "JobContext"]
