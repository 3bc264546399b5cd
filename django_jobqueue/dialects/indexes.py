"""Moved to `django_jobqueue.models.indexes` (StateIndex, ReadyIndex and PartialIndex);
this path still works, with a DeprecationWarning."""

import warnings

from ..models.indexes import *  # noqa: F403

warnings.warn(
    "django_jobqueue.dialects.indexes moved to django_jobqueue.models.indexes.",
    DeprecationWarning,
    stacklevel=2,
)
