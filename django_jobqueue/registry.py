"""Handler keys -> callables: the allowlist of what a worker may run."""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from django.db import DatabaseError

from .exceptions import HandlerRegistrationError, InvalidJobError, UnknownHandlerError

F = TypeVar("F", bound=Callable[..., Any])

# Matched with fullmatch(): with match() and "$", a key ending in "\n" would pass.
KEY_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:\-]{0,199}")
# A handler's version: "" (none), or 1 to 50 characters of a key's alphabet ("2", "2025-06").
VERSION_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:\-]{0,49}")


@dataclasses.dataclass(frozen=True)
class Handler:
    """A registered handler: its key, the callable, and how to call it."""

    key: str
    func: Callable[..., Any]
    takes_context: bool
    is_async: bool
    # The resources its jobs use by default (`uses=`): a dict, or a callable of the job's
    # arguments that returns one.
    uses: Mapping[str, int] | Callable[[dict[str, Any]], Mapping[str, int] | None] | None = None
    version: str = ""  # "" for a handler registered without one

    def default_uses(self, args: dict[str, Any]) -> Mapping[str, int] | None:
        """The resources a job of this handler uses when `enqueue()` names none.

        InvalidJobError (nothing written) if the handler's callable fails on `args`: the
        arguments lack what it reads, which is bad input like a bad `uses`.
        """
        if not callable(self.uses):
            return self.uses
        try:
            return self.uses(args)
        except DatabaseError:  # the database failing, not the arguments
            raise
        except Exception as exc:
            raise InvalidJobError(
                f"uses: the default of handler {self.key!r} failed on the job's arguments: "
                f"{type(exc).__name__}: {exc}"
            ) from exc


_handlers: dict[str, Handler] = {}  # the newest version of each key
_versions: dict[str, dict[str, Handler]] = {}  # every version of each key, oldest first
_allowlist: tuple[str, ...] | None = None  # sorted keys, rebuilt after a change
_served: tuple[tuple[str, tuple[str, ...]], ...] | None = None  # see served()


def handler(
    key: str,
    *,
    takes_context: bool = False,
    uses: Mapping[str, int] | Callable[[dict[str, Any]], Mapping[str, int] | None] | None = None,
    version: str = "",
) -> Callable[[F], F]:
    """Register the decorated function as the handler for `key` (or as one version of it).

    The registry is the allowlist of what `enqueue()` accepts and what a worker runs: a worker
    claims only jobs whose handler it has. The worker calls ``func(**job.args)``, or
    ``func(ctx, **job.args)`` with `takes_context`, and stores what it returns as the job's
    result, which must be JSON (else the job dies with `ResultNotStored`). An ``async def``
    function runs as a task on the worker's event loop (one per worker process).

    Args:
        key: 1 to 200 characters: a letter, digit or ``_``, then letters, digits, ``_``,
            ``.``, ``:`` or ``-``; a dotted name such as ``"shop.send_confirmation"``.
        takes_context: Pass a `JobContext` to the handler as its first positional argument.
        uses: The resources of ``JOBQUEUE["LIMITS"]`` its jobs use, with their units, when
            `enqueue()` names none: a dict, or a callable that takes the job's arguments (a
            dict) and returns one (``lambda args: {f"tenant:{args['tenant']}": 1}``).
        version: This function's version of the handler: ``""`` (none), or 1 to 50 letters,
            digits, ``_``, ``.``, ``:`` or ``-`` (``"2"``). Several versions of one key may be
            registered side by side: a job runs under the version that first ran it, a new
            job under the newest, the one registered last (see the how-to "Changing a
            durable handler safely").

    Raises:
        HandlerRegistrationError: The key or the version is invalid, or that version of the
            key is already registered to another function (registering the same function
            again is allowed).
    """
    if not isinstance(key, str) or not KEY_RE.fullmatch(key):
        raise HandlerRegistrationError(
            f"Handler key {key!r} is invalid: use 1-200 letters, digits, '_', '.', ':' or '-'."
        )
    if not isinstance(version, str) or not (version == "" or VERSION_RE.fullmatch(version)):
        raise HandlerRegistrationError(
            f"Handler {key!r}: version {version!r} is invalid: use a string of 1-50 letters, "
            "digits, '_', '.', ':' or '-' (such as \"2\"), or \"\" for none."
        )
    if uses is not None and not (callable(uses) or isinstance(uses, Mapping)):
        raise HandlerRegistrationError(
            f"Handler {key!r}: uses must be a dict of resources and units, or a callable of "
            f"the job's arguments that returns one, not {uses!r}."
        )

    def decorator(func: F) -> F:
        if not callable(func):
            raise HandlerRegistrationError(f"Handler {key!r} must be callable.")
        known = _versions.setdefault(key, {})
        existing = known.get(version)
        if existing is not None and _qualname(existing.func) != _qualname(func):
            of = f" version {version!r}" if version else ""
            raise HandlerRegistrationError(
                f"Handler key {key!r}{of} is already registered to {_qualname(existing.func)}."
            )
        _changed()
        # The same function registered again (a module imported twice) keeps its place.
        known[version] = Handler(
            key=key,
            func=func,
            takes_context=takes_context,
            is_async=inspect.iscoroutinefunction(func),
            uses=uses,
            version=version,
        )
        _handlers[key] = next(reversed(known.values()))
        return func

    return decorator


def get(key: str, version: str | None = None) -> Handler:
    """Return the handler registered under `key` (its `version`; None: the newest), or
    raise UnknownHandlerError."""
    if not isinstance(key, str):  # a list is not even hashable: say what is wrong
        raise UnknownHandlerError(
            f"A handler key is a string, such as 'shop.send_receipt', not "
            f"{type(key).__name__} {key!r}."
        )
    try:
        found = _handlers[key]
    except KeyError:
        raise UnknownHandlerError(
            f"No handler is registered under {key!r}. Register one with "
            f"@jobqueue.handler({key!r}) in a jobs.py module of an installed app."
        ) from None
    if version is None or version == found.version:
        return found
    try:
        return _versions[key][version]
    except KeyError:
        raise UnknownHandlerError(
            f"Handler {key!r} has no version {version!r} in this process (it has "
            f"{', '.join(map(repr, _versions[key]))})."
        ) from None


def versions(key: str) -> tuple[str, ...]:
    """Return the versions registered under `key`, oldest first (empty: none)."""
    return tuple(_versions.get(key, ()))


def key_of(func: Callable[..., Any]) -> str | None:
    """Return the key `func` is registered under, or None."""
    found = (h.key for vs in _versions.values() for h in vs.values() if h.func is func)
    return next(found, None)


def keys() -> list[str]:
    """Return the registered keys, sorted."""
    return sorted(_handlers)


def allowlist() -> tuple[str, ...]:
    """Return the registered keys, sorted, as a tuple kept until the registry changes.

    A worker claims only jobs of these types: a job whose handler this process lacks (a newer
    release's, during a rolling deploy) is left for a worker that has it.
    """
    global _allowlist
    if _allowlist is None:
        _allowlist = tuple(sorted(_handlers))
    return _allowlist


def served() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Return (key, its versions, oldest first) of every registered key, sorted by key, as a
    tuple kept until the registry changes: what a worker claims (see `versions`)."""
    global _served
    if _served is None:
        _served = tuple((key, tuple(_versions[key])) for key in allowlist())
    return _served


def unregister(key: str, version: str | None = None) -> None:
    """Forget the handler under `key`, or only its `version` (for tests)."""
    _changed()
    if version is None:
        _handlers.pop(key, None)
        _versions.pop(key, None)
        return
    left = _versions.get(key, {})
    left.pop(version, None)
    if left:
        _handlers[key] = next(reversed(left.values()))
    else:
        _handlers.pop(key, None)
        _versions.pop(key, None)


def _changed() -> None:
    global _allowlist, _served
    _allowlist = _served = None


def _qualname(func: Callable[..., Any]) -> str:
    return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"
