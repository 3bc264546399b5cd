"""Moved to `django_jobqueue.models.literals` (array());
this path still works, with a DeprecationWarning."""

import warnings

from ..models.literals import *  # noqa: F403

warnings.warn(
    "django_jobqueue.dialects.literals moved to django_jobqueue.models.literals.",
    DeprecationWarning,
    stacklevel=2,
)
