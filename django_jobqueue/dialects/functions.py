"""Moved to `django_jobqueue.models.functions` (DbNow and the other expressions);
this path still works, with a DeprecationWarning."""

import warnings

from ..models.functions import *  # noqa: F403

warnings.warn(
    "django_jobqueue.dialects.functions moved to django_jobqueue.models.functions.",
    DeprecationWarning,
    stacklevel=2,
)
