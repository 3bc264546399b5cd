"""A project's own subclass of JobQueueBackend, for the tests of TASKS naming a subclass."""

from __future__ import annotations

from django_jobqueue import backends

if backends.HAS_TASKS:

    class SubclassedBackend(backends.JobQueueBackend):
        """Still our backend: apps.py must discover tasks.py modules for it too."""
