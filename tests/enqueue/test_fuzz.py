"""Hypothesis fuzzing of enqueue(), graph() and enqueue_many() on the test's database.

Every call either writes what it was given (read back equal) or raises a JobQueueError before
anything is written, and the caller's transaction stays usable either way.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import django_jobqueue as jobqueue
from django_jobqueue.exceptions import JobQueueError
from django_jobqueue.models import Job

pytestmark = pytest.mark.django_db

FUZZ = settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Values a hostile or careless caller might pass: JSON, almost-JSON and not JSON at all.
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=10**4000, max_value=10**4400),  # around the 4,300-digit limit
    st.floats(),  # NaN and infinity included
    st.text(),  # NUL and lone surrogates included
    st.binary(max_size=4),
    st.datetimes(),
    st.sets(st.integers(), max_size=2),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(st.text(max_size=5), inner, max_size=4),
        st.dictionaries(st.integers(), inner, max_size=2),  # non-string keys
    ),
    max_leaves=12,
)
args_strategy = st.one_of(
    st.none(), st.dictionaries(st.text(max_size=8), values, max_size=4), values
)
offsets = st.builds(
    dt.timezone, st.timedeltas(min_value=dt.timedelta(hours=-23), max_value=dt.timedelta(hours=23))
)
run_after_strategy = st.one_of(
    st.none(),
    st.datetimes(timezones=st.one_of(st.none(), offsets)),
    st.timedeltas(),
)
labels = st.one_of(st.text(max_size=300), st.integers(), st.none())
options_strategy = st.fixed_dictionaries(
    {},
    optional={
        "priority": st.integers(),
        "weight": st.integers(),
        "max_attempts": st.integers(),
        "group": labels,
        "queue": labels,
        "unique_key": labels,
        "run_after": run_after_strategy,
        "timeout": st.one_of(st.floats(), st.integers(), st.timedeltas()),
    },
)


def as_json(value: Any) -> Any:
    """What a JSON round trip makes of `value` (tuples become lists)."""
    if isinstance(value, list | tuple):
        return [as_json(v) for v in value]
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    return value


def attempt(write: Any) -> Any:
    """Run `write` in a transaction rolled back afterwards; return its jobs, or the error."""
    before = Job.objects.count()
    with transaction.atomic():
        try:
            jobs = write()
        except JobQueueError as exc:
            # Refused: nothing written, and the transaction still runs queries.
            assert Job.objects.count() == before
            return exc
        stored = [Job.objects.get(pk=job.pk) for job in jobs]
        transaction.set_rollback(True)
    return stored


@FUZZ
@given(args=args_strategy, options=options_strategy)
def test_enqueue_round_trips_or_refuses_before_writing(args: Any, options: dict[str, Any]) -> None:
    def write() -> list[Job]:
        return [jobqueue.enqueue("test.noop", args, **options)]

    outcome = attempt(write)
    if isinstance(outcome, JobQueueError):
        return
    (job,) = outcome
    assert job.args == as_json(args or {})
    when = options.get("run_after")
    if isinstance(when, dt.datetime):
        assert job.run_after == when
    for name in ("priority", "weight", "max_attempts", "unique_key"):
        if options.get(name) is not None:
            assert getattr(job, name) == options[name]


@FUZZ
@given(specs=st.lists(st.tuples(st.just("test.noop"), args_strategy), max_size=4))
def test_enqueue_many_round_trips_or_refuses_before_writing(specs: list[Any]) -> None:
    outcome = attempt(lambda: jobqueue.enqueue_many(specs))
    if isinstance(outcome, JobQueueError):
        return
    assert [job.args for job in outcome] == [as_json(args or {}) for _, args in specs]


@FUZZ
@given(first=args_strategy, second=args_strategy, options=options_strategy)
def test_graph_round_trips_or_refuses_before_writing(
    first: Any, second: Any, options: dict[str, Any]
) -> None:
    options = {k: v for k, v in options.items() if k != "unique_key"}

    def write() -> list[Job]:
        with jobqueue.graph() as g:
            with_box = g.container("box")
            a = g.add("test.noop", first, parent=with_box)
            g.add("test.noop", second, depends_on=[a], **options)
        return [a]

    outcome = attempt(write)
    if isinstance(outcome, JobQueueError):
        return
    assert outcome[0].args == as_json(first or {})
