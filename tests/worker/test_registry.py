"""The handler registry: the allowlist of what a worker may run."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

import pytest

import django_jobqueue as jobqueue
from django_jobqueue import registry
from django_jobqueue.exceptions import (
    HandlerRegistrationError,
    InvalidJobError,
    JobQueueError,
    UnknownHandlerError,
)

# Every key tests/testapp/jobs.py registers.
TESTAPP_KEYS = {
    "test.noop",
    "test.add",
    "test.record",
    "test.fail",
    "test.fail_then_succeed",
    "test.retry_once",
    "test.fail_hard",
    "test.sleep",
    "test.spin",
    "test.async_add",
    "test.async_sleep",
    "test.crash_once",
    "test.crash_always",
    "test.bad_result",
    "test.upstream_sum",
}


@pytest.fixture
def scratch_keys() -> Iterator[list[str]]:
    """Keys registered by a test; unregistered afterwards so other tests see the real registry."""
    keys: list[str] = []
    yield keys
    for key in keys:
        registry.unregister(key)


def first(a: int) -> int:
    return a


def second(a: int) -> int:
    return -a


def test_autodiscovery_found_the_testapp_jobs_module() -> None:
    assert set(registry.keys()) >= TESTAPP_KEYS
    from tests.testapp import jobs

    assert registry.get("test.add").func is jobs.add
    assert registry.keys() == sorted(registry.keys())


def test_registered_handler_details() -> None:
    add = registry.get("test.add")
    assert (add.key, add.takes_context, add.is_async) == ("test.add", False, False)
    record = registry.get("test.record")
    assert record.takes_context is True and record.is_async is False
    async_add = registry.get("test.async_add")
    assert async_add.is_async is True and async_add.takes_context is False


def test_decorator_returns_the_function_unchanged(scratch_keys: list[str]) -> None:
    scratch_keys.append("scratch.first")
    assert jobqueue.handler("scratch.first")(first) is first
    assert first(2) == 2


def test_takes_context_is_recorded(scratch_keys: list[str]) -> None:
    scratch_keys.extend(["scratch.ctx", "scratch.noctx"])

    @jobqueue.handler("scratch.ctx", takes_context=True)
    def with_context(ctx: Any) -> None:
        return None

    jobqueue.handler("scratch.noctx")(first)
    assert registry.get("scratch.ctx").takes_context is True
    assert registry.get("scratch.noctx").takes_context is False


def test_async_handlers_are_recognised(scratch_keys: list[str]) -> None:
    scratch_keys.append("scratch.async")

    @jobqueue.handler("scratch.async")
    async def coroutine() -> int:
        return 1

    assert registry.get("scratch.async").is_async is True


def test_duplicate_key_for_another_function_is_refused(scratch_keys: list[str]) -> None:
    scratch_keys.append("scratch.dup")
    jobqueue.handler("scratch.dup")(first)
    with pytest.raises(HandlerRegistrationError, match=r"already registered to .*\.first"):
        jobqueue.handler("scratch.dup")(second)
    assert registry.get("scratch.dup").func is first


def test_a_testapp_key_cannot_be_taken_over() -> None:
    with pytest.raises(HandlerRegistrationError):
        jobqueue.handler("test.add")(second)
    assert registry.get("test.add").func(a=1, b=2) == 3


def test_registering_the_same_function_again_is_allowed(scratch_keys: list[str]) -> None:
    scratch_keys.append("scratch.same")
    jobqueue.handler("scratch.same")(first)
    jobqueue.handler("scratch.same")(first)
    # Changing how it is called is allowed too: the latest registration wins.
    jobqueue.handler("scratch.same", takes_context=True)(first)
    assert registry.get("scratch.same").takes_context is True


def test_reimporting_a_jobs_module_is_allowed() -> None:
    """A reloaded module registers new function objects with the same qualified names."""
    from tests.testapp import jobs

    before = registry.get("test.add").func
    reloaded = importlib.reload(jobs)
    assert registry.get("test.add").func is reloaded.add
    assert registry.get("test.add").func is not before
    assert registry.get("test.record").takes_context is True


@pytest.mark.parametrize(
    "key",
    [
        "",
        " ",
        "has space",
        "-leading-dash",
        ".leading-dot",
        "slash/key",
        "é",
        "k" * 201,
        "a\nb",
        "trailing\n",
    ],
)
def test_invalid_keys_are_refused(key: str) -> None:
    with pytest.raises(HandlerRegistrationError, match="is invalid"):
        jobqueue.handler(key)
    assert key not in set(registry.keys())


@pytest.mark.parametrize("key", [None, 42, b"bytes", ("a",)])
def test_non_string_keys_are_refused(key: Any) -> None:
    with pytest.raises(HandlerRegistrationError):
        jobqueue.handler(key)


@pytest.mark.parametrize(
    "key", ["a", "_private", "app.jobs:send-email", "v2.resize_image", "k" * 200, "0"]
)
def test_valid_keys(key: str, scratch_keys: list[str]) -> None:
    scratch_keys.append(key)
    jobqueue.handler(key)(first)
    assert registry.get(key).func is first


def test_non_callables_are_refused() -> None:
    with pytest.raises(HandlerRegistrationError, match="must be callable"):
        jobqueue.handler("scratch.not_callable")("not a function")  # type: ignore[type-var]
    assert "scratch.not_callable" not in set(registry.keys())


def test_unknown_key() -> None:
    with pytest.raises(UnknownHandlerError) as info:
        registry.get("no.such.key")
    assert isinstance(info.value, InvalidJobError)
    assert isinstance(info.value, JobQueueError) and isinstance(info.value, ValueError)
    assert "@jobqueue.handler('no.such.key')" in str(info.value)


def test_unregister(scratch_keys: list[str]) -> None:
    jobqueue.handler("scratch.gone")(first)
    registry.unregister("scratch.gone")
    registry.unregister("scratch.gone")  # forgetting an unknown key is fine
    with pytest.raises(UnknownHandlerError):
        registry.get("scratch.gone")


def test_registration_error_is_a_job_queue_error() -> None:
    assert issubclass(HandlerRegistrationError, JobQueueError)
