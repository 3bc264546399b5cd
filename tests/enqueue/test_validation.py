"""Bad enqueue input raises a documented exception before anything is written.

Every case runs inside the caller's own transaction, after the caller wrote a row of its own:
the error must leave that transaction usable (no "current transaction is aborted", no
TransactionManagementError), so the caller can catch it, go on, enqueue something valid and
commit. Every exception is an InvalidJobError: a JobQueueError and a ValueError.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import json
import math
import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connections, transaction
from django.test import override_settings
from django.utils import timezone
from hypothesis import given, settings
from hypothesis import strategies as st

import django_jobqueue as jobqueue
from django_jobqueue import validation
from django_jobqueue.exceptions import (
    InvalidArgumentsError,
    InvalidDependencyError,
    InvalidJobError,
    JobQueueError,
    UnknownHandlerError,
)
from django_jobqueue.models import Job, JobDependency
from tests.support.factories import JobFactory
from tests.testapp.models import Order

enqueue = jobqueue.enqueue


def _job_on_another_database() -> Job:
    job = Job(pk=1, type="test.noop")
    job._state.db = "replica"
    job._state.adding = False
    return job


def _nested(levels: int) -> Any:
    """A JSON value of `levels` nested arrays."""
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


def _in_graph(build: Callable[[Any], Any]) -> None:
    with jobqueue.graph() as g:
        build(g)


@dataclasses.dataclass
class Env:
    """Rows the bad calls point at, created before the job count is taken."""

    done: Job
    ready: Job
    order: Order
    missing: int


def make_env() -> Env:
    done = JobFactory(state=Job.State.DONE, finished_at=timezone.now())
    ready = JobFactory()
    return Env(
        done=done, ready=ready, order=Order.objects.create(number="x"), missing=ready.pk + 1000
    )


# (id, call, expected exception, text the message must contain)
BAD_INPUT: list[tuple[str, Callable[[Env], Any], type[Exception], str]] = [
    ("unknown-handler", lambda env: enqueue("no.such.handler"), UnknownHandlerError, "no.such"),
    ("handler-not-a-string", lambda env: enqueue(42), UnknownHandlerError, "42"),  # type: ignore[arg-type]
    ("args-list", lambda env: enqueue("test.noop", [1, 2]), InvalidArgumentsError, "list"),  # type: ignore[arg-type]
    ("args-string", lambda env: enqueue("test.noop", "a=1"), InvalidArgumentsError, "str"),  # type: ignore[arg-type]
    (
        "args-datetime",
        lambda env: enqueue("test.noop", {"when": timezone.now()}),
        InvalidArgumentsError,
        "args['when']",
    ),
    (
        "args-nested-decimal",
        lambda env: enqueue("test.noop", {"order": {"lines": [1, decimal.Decimal("2.5")]}}),
        InvalidArgumentsError,
        "args['order']['lines'][1]",
    ),
    (
        "args-set",
        lambda env: enqueue("test.noop", {"s": {1, 2}}),
        InvalidArgumentsError,
        "args['s']",
    ),
    (
        "args-object",
        lambda env: enqueue("test.noop", {"o": object()}),
        InvalidArgumentsError,
        "args['o']",
    ),
    ("args-nan", lambda env: enqueue("test.noop", {"x": math.nan}), InvalidArgumentsError, "nan"),
    (
        "args-inf-nested",
        lambda env: enqueue("test.noop", {"x": [1.0, {"y": -math.inf}]}),
        InvalidArgumentsError,
        "args['x'][1]['y']",
    ),
    ("args-int-key", lambda env: enqueue("test.noop", {1: "a"}), InvalidArgumentsError, "1"),  # type: ignore[dict-item]
    (
        "args-nested-int-key",
        lambda env: enqueue("test.noop", {"d": {1: "a"}}),
        InvalidArgumentsError,
        "args['d']",
    ),
    (
        "args-nul-in-a-value",
        lambda env: enqueue("test.noop", {"s": ["ok", "a\x00b"]}),
        InvalidArgumentsError,
        "args['s'][1] contains a NUL",
    ),
    (
        "args-nul-in-a-key",
        lambda env: enqueue("test.noop", {"d": {"k\x00": 1}}),
        InvalidArgumentsError,
        "NUL",
    ),
    (
        "args-nul-in-a-top-level-key",
        lambda env: enqueue("test.noop", {"k\x00": 1}),
        InvalidArgumentsError,
        "NUL",
    ),
    (
        "args-lone-surrogate",
        lambda env: enqueue("test.noop", {"s": "\ud800"}),
        InvalidArgumentsError,
        "args['s'] contains a lone surrogate",
    ),
    ("weight-0", lambda env: enqueue("test.noop", weight=0), InvalidJobError, "weight"),
    ("weight-negative", lambda env: enqueue("test.noop", weight=-3), InvalidJobError, "weight"),
    ("weight-float", lambda env: enqueue("test.noop", weight=1.5), InvalidJobError, "weight"),  # type: ignore[arg-type]
    ("weight-str", lambda env: enqueue("test.noop", weight="2"), InvalidJobError, "weight"),  # type: ignore[arg-type]
    ("weight-bool", lambda env: enqueue("test.noop", weight=True), InvalidJobError, "weight"),
    (
        "weight-too-big",
        lambda env: enqueue("test.noop", weight=2**31),
        InvalidJobError,
        "weight",
    ),
    ("max-attempts-0", lambda env: enqueue("test.noop", max_attempts=0), InvalidJobError, "max_"),
    (
        "max-attempts-neg",
        lambda env: enqueue("test.noop", max_attempts=-1),
        InvalidJobError,
        "max_",
    ),
    (
        "max-attempts-float",
        lambda env: enqueue("test.noop", max_attempts=2.0),
        InvalidJobError,
        "max",
    ),  # type: ignore[arg-type]
    ("priority-float", lambda env: enqueue("test.noop", priority=1.0), InvalidJobError, "priority"),  # type: ignore[arg-type]
    (
        "priority-str",
        lambda env: enqueue("test.noop", priority="high"),
        InvalidJobError,
        "priority",
    ),  # type: ignore[arg-type]
    ("priority-none", lambda env: enqueue("test.noop", priority=None), InvalidJobError, "priority"),  # type: ignore[arg-type]
    (
        "priority-too-big",
        lambda env: enqueue("test.noop", priority=2**31),
        InvalidJobError,
        "priority",
    ),
    (
        "priority-too-small",
        lambda env: enqueue("test.noop", priority=-(2**31) - 1),
        InvalidJobError,
        "priority",
    ),
    ("timeout-0", lambda env: enqueue("test.noop", timeout=0), InvalidJobError, "timeout"),
    ("timeout-negative", lambda env: enqueue("test.noop", timeout=-5), InvalidJobError, "timeout"),
    (
        "timeout-zero-timedelta",
        lambda env: enqueue("test.noop", timeout=dt.timedelta(0)),
        InvalidJobError,
        "timeout",
    ),
    (
        "timeout-negative-timedelta",
        lambda env: enqueue("test.noop", timeout=dt.timedelta(seconds=-1)),
        InvalidJobError,
        "timeout",
    ),
    ("timeout-nan", lambda env: enqueue("test.noop", timeout=math.nan), InvalidJobError, "timeout"),
    ("timeout-inf", lambda env: enqueue("test.noop", timeout=math.inf), InvalidJobError, "timeout"),
    ("timeout-str", lambda env: enqueue("test.noop", timeout="10"), InvalidJobError, "timeout"),  # type: ignore[arg-type]
    ("timeout-bool", lambda env: enqueue("test.noop", timeout=True), InvalidJobError, "timeout"),
    (
        "run-after-naive",
        lambda env: enqueue("test.noop", run_after=dt.datetime(2030, 1, 1, 12, 0)),
        InvalidJobError,
        "timezone-aware",
    ),
    (
        "run-after-str",
        lambda env: enqueue("test.noop", run_after="2030-01-01"),  # type: ignore[arg-type]
        InvalidJobError,
        "run_after",
    ),
    (
        "run-after-date",
        lambda env: enqueue("test.noop", run_after=dt.date(2030, 1, 1)),  # type: ignore[arg-type]
        InvalidJobError,
        "run_after",
    ),
    ("queue-empty", lambda env: enqueue("test.noop", queue=""), InvalidJobError, "queue"),
    ("queue-not-str", lambda env: enqueue("test.noop", queue=5), InvalidJobError, "queue"),  # type: ignore[arg-type]
    ("queue-too-long", lambda env: enqueue("test.noop", queue="q" * 101), InvalidJobError, "queue"),
    ("queue-nul", lambda env: enqueue("test.noop", queue="a\x00"), InvalidJobError, "NUL"),
    ("group-nul", lambda env: enqueue("test.noop", group="\x00"), InvalidJobError, "NUL"),
    (
        "group-lone-surrogate",
        lambda env: enqueue("test.noop", group="\udfff"),
        InvalidJobError,
        "surrogate",
    ),
    ("group-none", lambda env: enqueue("test.noop", group=None), InvalidJobError, "group"),  # type: ignore[arg-type]
    ("group-too-long", lambda env: enqueue("test.noop", group="g" * 201), InvalidJobError, "group"),
    (
        "depends-on-missing-id",
        lambda env: enqueue("test.noop", depends_on=[env.missing]),
        InvalidDependencyError,
        "do not exist",
    ),
    (
        "depends-on-missing-among-existing",
        lambda env: enqueue("test.noop", depends_on=[env.ready, env.missing]),
        InvalidDependencyError,
        "do not exist",
    ),
    (
        "depends-on-unsaved-job",
        lambda env: enqueue("test.noop", depends_on=[Job(type="test.noop")]),
        InvalidDependencyError,
        "not saved",
    ),
    (
        "depends-on-job-of-another-database",
        lambda env: enqueue("test.noop", depends_on=[_job_on_another_database()]),
        InvalidDependencyError,
        "'replica'",
    ),
    (
        "depends-on-other-model",
        lambda env: enqueue("test.noop", depends_on=[env.order]),
        InvalidDependencyError,
        "Order",
    ),
    (
        "depends-on-str-id",
        lambda env: enqueue("test.noop", depends_on=["1"]),  # type: ignore[list-item]
        InvalidDependencyError,
        "'1'",
    ),
    (
        "depends-on-bool",
        lambda env: enqueue("test.noop", depends_on=[True]),
        InvalidDependencyError,
        "True",
    ),
    (
        "depends-on-a-single-job",
        lambda env: enqueue("test.noop", depends_on=env.ready),  # type: ignore[arg-type]
        InvalidDependencyError,
        "depends_on",
    ),
    (
        "depends-on-a-single-id",
        lambda env: enqueue("test.noop", depends_on=5),  # type: ignore[arg-type]
        InvalidDependencyError,
        "depends_on",
    ),
    (
        "depends-on-a-string",
        lambda env: enqueue("test.noop", depends_on="12"),  # type: ignore[arg-type]
        InvalidDependencyError,
        "depends_on",
    ),
    (
        "depends-on-none",
        lambda env: enqueue("test.noop", depends_on=None),  # type: ignore[arg-type]
        InvalidDependencyError,
        "depends_on",
    ),
    (
        "parent-missing",
        lambda env: enqueue("test.noop", parent=env.missing),
        InvalidDependencyError,
        "do not exist",
    ),
    (
        "parent-unsaved",
        lambda env: enqueue("test.noop", parent=Job(type="test.noop")),
        InvalidDependencyError,
        "not saved",
    ),
    (
        "parent-of-another-database",
        lambda env: enqueue("test.noop", parent=_job_on_another_database()),
        InvalidDependencyError,
        "'replica'",
    ),
    (
        "parent-not-a-container",
        lambda env: enqueue("test.noop", parent=env.ready),
        InvalidDependencyError,
        "not a container",
    ),
    (
        "parent-list",
        lambda env: enqueue("test.noop", parent=[1]),  # type: ignore[arg-type]
        InvalidDependencyError,
        "parent",
    ),
    ("handler-a-list", lambda env: enqueue(["plain"]), UnknownHandlerError, "not list"),  # type: ignore[arg-type]
    (
        "handler-a-list-in-enqueue-many",
        lambda env: jobqueue.enqueue_many([(["plain"], {})]),  # type: ignore[list-item]
        UnknownHandlerError,
        "not list",
    ),
    (
        "handler-a-dict-in-a-graph",
        lambda env: _in_graph(lambda g: g.add({"k": 1})),  # type: ignore[arg-type]
        UnknownHandlerError,
        "not dict",
    ),
    (
        "args-nested-31-levels",
        lambda env: enqueue("test.noop", {"d": _nested(30)}),
        InvalidArgumentsError,
        "more than 30 levels",
    ),
    ("group-esc", lambda env: enqueue("test.noop", group="a\x1b[2J"), InvalidJobError, "\\x1b"),
    ("queue-cr", lambda env: enqueue("test.noop", queue="q\rHealthy."), InvalidJobError, "\\r"),
    (
        "unique-key-bel",
        lambda env: enqueue("test.noop", unique_key="k\a"),
        InvalidJobError,
        "\\x07",
    ),
    ("group-newline", lambda env: enqueue("test.noop", group="a\nb"), InvalidJobError, "\\n"),
    ("group-c1", lambda env: enqueue("test.noop", group="a\x9bb"), InvalidJobError, "\\x9b"),
    ("group-bidi", lambda env: enqueue("test.noop", group="a\u202eb"), InvalidJobError, "\\u202e"),
    (
        "container-name-esc",
        lambda env: jobqueue.container("box\x1b").__enter__(),
        InvalidJobError,
        "control characters",
    ),
    (
        "graph-queue-esc",
        lambda env: _in_graph(lambda g: g.add("test.noop", queue="q\x1b")),
        InvalidJobError,
        "control characters",
    ),
    (
        "missing-dependency-after-a-valid-one",
        lambda env: enqueue("test.noop", depends_on=[env.ready], parent=env.missing),
        InvalidDependencyError,
        "do not exist",
    ),
]


def counts() -> tuple[int, int, int]:
    return Job.objects.count(), JobDependency.objects.count(), Order.objects.count()


@pytest.mark.parametrize(
    ("call", "error", "text"),
    [case[1:] for case in BAD_INPUT],
    ids=[case[0] for case in BAD_INPUT],
)
@pytest.mark.django_db
def test_bad_input_raises_and_leaves_the_transaction_usable(
    call: Callable[[Env], Any], error: type[Exception], text: str
) -> None:
    env = make_env()
    with transaction.atomic():
        order = Order.objects.create(number="before")
        before = counts()
        with pytest.raises(error) as info:
            call(env)
        assert text in str(info.value)
        assert counts() == before  # nothing was written ...
        # ... and the caller's transaction still works: it reads, writes, enqueues, commits.
        Order.objects.filter(pk=order.pk).update(number="after")
        good = enqueue("test.add", {"a": 1, "b": 2}, depends_on=[env.done, env.ready])
    assert Order.objects.get(pk=order.pk).number == "after"
    assert Job.objects.get(pk=good.pk).state == Job.State.WAITING
    assert counts() == (before[0] + 1, before[1] + 2, before[2])


def test_every_enqueue_error_is_a_value_error_and_a_job_queue_error() -> None:
    for _, _, error, _ in BAD_INPUT:
        assert issubclass(error, InvalidJobError)
        assert issubclass(error, JobQueueError)
        assert issubclass(error, ValueError)


@pytest.mark.django_db(transaction=True)
def test_bad_input_in_autocommit_writes_nothing() -> None:
    env = make_env()
    before = counts()
    for name, call, error, _ in BAD_INPUT:
        with pytest.raises(error):
            call(env)
        assert counts() == before, name


@pytest.mark.django_db(transaction=True)
def test_bad_input_in_a_real_transaction_then_commit() -> None:
    """All the bad calls in one transaction that then commits, checked from another connection."""
    env = make_env()
    with transaction.atomic():
        Order.objects.create(number="C-1")
        for _, call, error, _ in BAD_INPUT:
            with pytest.raises(error):
                call(env)
        good = enqueue("test.noop", depends_on=[env.ready])
    seen: dict[str, Any] = {}

    def read() -> None:
        try:
            seen["orders"] = Order.objects.count()
            seen["jobs"] = sorted(Job.objects.values_list("pk", flat=True))
            seen["edges"] = list(JobDependency.objects.values_list("job_id", "depends_on_id"))
        finally:
            connections.close_all()

    thread = threading.Thread(target=read)
    thread.start()
    thread.join(60)
    assert seen == {
        "orders": 2,
        "jobs": sorted([env.done.pk, env.ready.pk, good.pk]),
        "edges": [(good.pk, env.ready.pk)],
    }


@pytest.mark.django_db
def test_naive_run_after_is_refused_even_without_use_tz() -> None:
    """USE_TZ = False is refused by check E003; a naive time would be read in UTC anyway."""
    with override_settings(USE_TZ=False), pytest.raises(InvalidJobError, match="aware"):
        validation.check_run_after(dt.datetime(2030, 1, 1))


def test_unknown_handler_message_says_how_to_register() -> None:
    with pytest.raises(UnknownHandlerError, match=r"@jobqueue.handler\('nope'\)"):
        validation_free_get("nope")


def validation_free_get(key: str) -> Any:
    from django_jobqueue import registry

    return registry.get(key)


# --- the checks themselves -------------------------------------------------------------------

# Any text a database can store: no NUL, no lone surrogates.
storable = st.characters(exclude_categories=["Cs"], exclude_characters="\x00")
texts = st.text(storable)
keys = st.text(storable, max_size=8)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: abs(f) < 1e16)
    | texts,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=12,
)
json_objects = st.dictionaries(keys, json_values, max_size=5)


@given(json_objects)
def test_check_args_accepts_every_json_object(args: dict[str, Any]) -> None:
    checked = validation.check_args("k", args)
    assert checked == args
    assert json.loads(json.dumps(checked, allow_nan=False)) == json.loads(json.dumps(args))


@settings(max_examples=40, deadline=None)
@given(json_objects)
@pytest.mark.django_db
def test_accepted_args_round_trip_through_the_database(args: dict[str, Any]) -> None:
    """Whatever check_args accepts, every database stores and returns unchanged."""
    with transaction.atomic():
        job = enqueue("test.noop", args)
        assert as_numbers(Job.objects.get(pk=job.pk).args) == as_numbers(args)


def as_numbers(value: Any) -> Any:
    """`value` with every number as a float.

    PostgreSQL's jsonb keeps numbers as `numeric` and prints them without an exponent, so a
    float such as 5e+16 comes back as the int 50000000000000000: the same number, another type.
    """
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, list):
        return [as_numbers(v) for v in value]
    return {k: as_numbers(v) for k, v in value.items()}


@given(texts.map(lambda t: t + "\x00"), st.sampled_from(["value", "key", "nested"]))
def test_check_args_rejects_nul_anywhere(text: str, where: str) -> None:
    args: dict[str, Any] = {
        "value": {"v": text},
        "key": {text: 1},
        "nested": {"a": [{"b": text}]},
    }[where]
    with pytest.raises(InvalidArgumentsError, match="NUL"):
        validation.check_args("k", args)


@given(
    st.dictionaries(keys, json_values, max_size=3),
    st.sampled_from([math.nan, math.inf, -math.inf]),
    st.lists(st.text(storable, min_size=1, max_size=5), min_size=1, max_size=3, unique=True),
)
def test_check_args_rejects_a_non_finite_float_anywhere(
    base: dict[str, Any], bad: float, path: list[str]
) -> None:
    args = dict(base)
    node: dict[str, Any] = args
    for key in path[:-1]:
        node[key] = {}
        node = node[key]
    node[path[-1]] = [bad]
    with pytest.raises(InvalidArgumentsError) as info:
        validation.check_args("k", args)
    assert "".join(f"[{k!r}]" for k in path) + "[0]" in str(info.value)


def test_check_args_of_none_is_an_empty_dict() -> None:
    assert validation.check_args("k", None) == {}


def test_check_args_copies_mappings() -> None:
    from types import MappingProxyType

    source = {"a": 1}
    checked = validation.check_args("k", MappingProxyType(source))
    assert checked == {"a": 1} and type(checked) is dict
    assert validation.check_args("k", source) is not source


def test_check_args_accepts_json_subclasses() -> None:
    import enum

    class Colour(enum.StrEnum):
        RED = "red"

    class Size(enum.IntEnum):
        BIG = 3

    assert validation.check_args("k", {"c": Colour.RED, "s": Size.BIG, "t": (1, 2)})


@given(st.integers(min_value=1, max_value=2**31 - 1))
def test_check_positive_int_accepts(value: int) -> None:
    assert validation.check_positive_int("n", value) == value


@given(st.integers(max_value=0) | st.integers(min_value=2**31))
def test_check_positive_int_rejects(value: int) -> None:
    with pytest.raises(InvalidJobError):
        validation.check_positive_int("n", value)


@given(st.integers(min_value=-(2**31), max_value=2**31 - 1))
def test_check_int_accepts_the_column_range(value: int) -> None:
    assert validation.check_int("n", value) == value


@given(st.floats(min_value=1e-6, max_value=1e9) | st.integers(min_value=1, max_value=10**9))
def test_check_timeout_accepts_positive_seconds(value: float) -> None:
    assert validation.check_timeout(value) == float(value)
    # A timedelta keeps microseconds.
    assert validation.check_timeout(dt.timedelta(seconds=value)) == pytest.approx(value, abs=1e-6)


def test_check_timeout_none() -> None:
    assert validation.check_timeout(None) is None


def test_a_timeout_too_large_for_a_float_is_bad_input() -> None:
    with pytest.raises(InvalidJobError, match="timeout must be seconds"):
        validation.check_timeout(10**400)  # was OverflowError from math.isfinite()
    assert not validation.finite(10**400) and not validation.finite(True)
    assert validation.finite(10**300) and validation.finite(-1.5)


def test_check_label() -> None:
    assert validation.check_label("group", "", 10, allow_empty=True) == ""
    assert validation.check_label("queue", "q" * 10, 10) == "q" * 10
    with pytest.raises(InvalidJobError, match="at most 10"):
        validation.check_label("queue", "q" * 11, 10)


def test_check_run_after() -> None:
    aware = timezone.now()
    assert validation.check_run_after(None) is None
    assert validation.check_run_after(aware) is aware
    assert validation.check_run_after(dt.timedelta(seconds=5)) == dt.timedelta(seconds=5)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"at": "tomorrow"}, TypeError, "at must be an aware datetime, not str"),
        ({"at": 12345}, TypeError, "at must be an aware datetime, not int"),
        ({"at": dt.date(2030, 1, 1)}, TypeError, "not date"),
        ({"at": dt.datetime(2030, 1, 1)}, ValueError, "timezone-aware"),
        ({"at": dt.datetime(9999, 1, 1, tzinfo=dt.UTC)}, ValueError, "before 9000-01-01"),
        ({"delay": decimal.Decimal("5")}, TypeError, "not Decimal"),
        ({"delay": "5"}, TypeError, "not str"),
        ({"delay": True}, TypeError, "not bool"),
        ({"delay": math.nan}, ValueError, "not NaN"),
        ({"delay": math.inf}, ValueError, "at most 36525 days"),
        ({"delay": 10**400}, ValueError, "at most 36525 days"),
        ({"delay": 4e9}, ValueError, "at most 36525 days"),
        ({"delay": dt.timedelta.max}, ValueError, "at most 36525 days"),
        ({"delay": -0.5}, ValueError, "must not be negative"),
        ({"delay": -dt.timedelta(seconds=1)}, ValueError, "must not be negative"),
        ({"reason": 42}, TypeError, "reason must be a string"),
    ],
)
def test_retry_refuses_a_bad_argument_where_it_is_raised(kwargs, error, message):
    with pytest.raises(error, match=message):
        jobqueue.Retry(**kwargs)


def test_retry_keeps_good_arguments():
    at = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    assert jobqueue.Retry(at=at).at is at
    assert jobqueue.Retry(0).delay == 0.0
    assert jobqueue.Retry(5).delay == 5.0
    assert jobqueue.Retry(2.5).delay == 2.5
    assert jobqueue.Retry(dt.timedelta(days=36525)).delay == 36525 * 86400
    assert (jobqueue.Retry().delay, jobqueue.Retry().at) == (None, None)


def test_retry_at_is_kept_in_utc_whatever_its_offset():
    # PostgreSQL refuses to store an offset of +16:00: the same instant in UTC is stored.
    at = dt.datetime(2030, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=16)))
    kept = jobqueue.Retry(at=at).at
    assert kept == at and kept.utcoffset() == dt.timedelta(0)


def test_retry_takes_a_delay_or_a_time_never_both_nor_a_negative_delay():
    """`raise jobqueue.Retry(...)` checks its arguments where the handler raises it."""
    assert jobqueue.Retry(dt.timedelta(minutes=2)).delay == 120.0
    with pytest.raises(ValueError, match="delay or at, not both"):
        jobqueue.Retry(5, at=dt.datetime(2030, 1, 1, tzinfo=dt.UTC))
    with pytest.raises(ValueError, match="must not be negative"):
        jobqueue.Retry(-1)
