"""Moved to `django_jobqueue.models.fields` (KeyField, AnyOf and AlterKeyField);
this path still works, with a DeprecationWarning."""

import warnings

from ..models.fields import *  # noqa: F403

warnings.warn(
    "django_jobqueue.dialects.fields moved to django_jobqueue.models.fields.",
    DeprecationWarning,
    stacklevel=2,
)
