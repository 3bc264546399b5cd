"""Operator actions on jobs: cancel, retry, run now, release a lease, delete finished jobs.

The documented import path; the code is in `engine/control.py`.
"""

from .engine.control import cancel, delete_finished, release_lease, retry, run_now

__all__ = ["cancel", "delete_finished", "release_lease", "retry", "run_now"]
