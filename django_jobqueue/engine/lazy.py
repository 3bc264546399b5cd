"""Public names a package loads on first use (a module `__getattr__`, PEP 562).

The public API needs the models, which need the app registry, while `import django_jobqueue`
(and `django_jobqueue.testing`) must work before Django is set up: in settings, in jobs.py at
import time, in a pytest plugin.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import import_module
from typing import Any


def load(package: str, lazy: Mapping[str, str], name: str) -> Any:
    """Return `name` from the submodule of `package` that `lazy` names for it."""
    module = lazy.get(name)
    if module is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    # No submodule is named like a lazy name: importing a submodule sets the package
    # attribute of its name, which would shadow the function of that name.
    return getattr(import_module(f"{package}.{module}"), name)
