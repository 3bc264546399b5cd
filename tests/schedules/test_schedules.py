"""Schedules (JOBQUEUE["SCHEDULES"]): slots, validation, and each slot enqueued exactly once
by several worker processes over minutes of simulated time, with the catch-up policies."""

from __future__ import annotations

import datetime as dt
import json
import zoneinfo
from collections import Counter
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command

import django_jobqueue as jobqueue
from django_jobqueue import registry, schedules
from django_jobqueue.checks import check_schedules, check_settings
from django_jobqueue.dialects import get_dialect
from django_jobqueue.exceptions import HandlerRegistrationError
from django_jobqueue.models import Job, ScheduleState
from django_jobqueue.worker import schedule_runner
from tests.conftest import assert_clean_log, poll
from tests.support.markers import requires_tasks
from tests.support.workflow_support import FAST, run_burst
from tests.testapp.clock import set_clock

UTC = dt.UTC
PARIS = zoneinfo.ZoneInfo("Europe/Paris")


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).astimezone(UTC)


def schedule(**raw: object) -> schedules.Schedule:
    return schedules.parse("s", {"handler": "test.noop", **raw})


# -- slots ---------------------------------------------------------------------------------


def test_every_slots_fall_on_multiples_since_the_epoch():
    s = schedule(every=30)
    assert s.next_after(at("2026-01-01T00:00:10+00:00")) == at("2026-01-01T00:00:30+00:00")
    assert s.next_after(at("2026-01-01T00:00:30+00:00")) == at("2026-01-01T00:01:00+00:00")
    assert s.latest_until(at("2026-01-01T00:00:59.9+00:00")) == at("2026-01-01T00:00:30+00:00")
    assert s.latest_until(at("2026-01-01T00:01:00+00:00")) == at("2026-01-01T00:01:00+00:00")


def test_cron_slots_follow_the_time_zone_across_daylight_saving():
    s = schedule(cron="30 2 * * *", timezone="Europe/Paris")
    # 02:30 does not exist in Paris on 2026-03-29 (clocks jump 02:00 -> 03:00): cronsim runs
    # it at 03:00 local, the next days at 02:30 CEST (00:30 UTC).
    first = s.next_after(at("2026-03-28T12:00:00+00:00"))
    assert first.astimezone(PARIS).isoformat() == "2026-03-29T03:00:00+02:00"
    second = s.next_after(first)
    assert second == at("2026-03-30T00:30:00+00:00")
    assert s.latest_until(second) == second
    assert s.latest_until(second - dt.timedelta(seconds=1)) == first


def test_slots_walk_forward_through_the_repeated_autumn_hour():
    """Paris falls back from 03:00 CEST to 02:00 CET (01:00 UTC) on 2026-10-25: a worker
    looking every 5 minutes finds every 20-minute slot once, in UTC order, the repeated local
    hour included."""
    s = schedule(cron="*/20 * * * *", timezone="Europe/Paris")
    last, found = at("2026-10-24T23:55:00+00:00"), []
    now = last
    while now < at("2026-10-25T02:30:00+00:00"):
        now += dt.timedelta(minutes=5)
        slot, run = s.decide(last, now)
        if slot is not None:
            assert run and slot > last
            found.append(slot.strftime("%H:%M"))
            last = slot
    assert found == [f"{h:02}:{m:02}" for h in (0, 1, 2) for m in (0, 20, 40)][:-1]
    assert s.latest_until(at("2026-10-25T01:59:00+00:00")) == at("2026-10-25T01:40:00+00:00")


def test_only_the_latest_due_slot_runs_and_skip_drops_it_when_late():
    once = schedule(every=60)
    skip = schedule(every=60, catch_up="skip", grace=10)
    last = at("2026-01-01T00:00:00+00:00")
    assert once.decide(last, at("2026-01-01T00:00:59+00:00")) == (None, False)
    # Found 5 s late: both run it.
    assert once.decide(last, at("2026-01-01T00:01:05+00:00")) == (at("2026-01-01T00:01:00"), True)
    assert skip.decide(last, at("2026-01-01T00:01:05+00:00")) == (at("2026-01-01T00:01:00"), True)
    # Ten slots missed, the latest 30 s late: "once" runs that one; "skip" moves past it.
    now = at("2026-01-01T00:10:30+00:00")
    assert once.decide(last, now) == (at("2026-01-01T00:10:00+00:00"), True)
    assert skip.decide(last, now) == (at("2026-01-01T00:10:00+00:00"), False)


# -- validation ----------------------------------------------------------------------------


def _deep(levels: int) -> Any:
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"handler": "no.such", "every": 5}, "No handler is registered under 'no.such'"),
        ({"handler": "test.noop", "cron": "61 * * * *"}, "is not a valid cron expression"),
        ({"handler": "test.noop", "cron": "* * *"}, "is not a valid cron expression"),
        ({"handler": "test.noop", "cron": "0 3 * * *", "timezone": "Mars/Base"}, "time zone"),
        ({"handler": "test.noop", "cron": "0 3 * * *", "every": 5}, "exactly one of 'cron'"),
        ({"handler": "test.noop"}, "exactly one of 'cron'"),
        ({"handler": "test.noop", "every": 0}, "'every' must be a whole number"),
        ({"handler": "test.noop", "every": 1.5}, "'every' must be a whole number"),
        ({"handler": "test.noop", "every": 5, "catch_up": "all"}, "'catch_up' must be"),
        ({"handler": "test.noop", "every": 5, "grace": 0}, "'grace' must be"),
        ({"handler": "test.noop", "every": 5, "grace": 10**400}, "'grace' must be"),
        ({"handler": "test.noop", "every": 5, "when": 1}, "unknown key(s) 'when'"),
        ({"handler": "test.noop", "every": 5, "args": {"x": {1, 2}}}, "not JSON-serializable"),
        ({"handler": "test.noop", "every": 5, "queue": ""}, "queue must be a non-empty"),
        ({"every": 5}, "'handler'"),
        # Passed E010 once, then failed at every slot:
        ({"handler": "test.noop", "every": 10**12}, "from 1 to 31,622,400"),
        ({"handler": "test.noop", "every": 5, "group": "g\x1b[2J"}, "control characters"),
        ({"handler": "test.noop", "every": 5, "queue": "q\rHealthy."}, "control characters"),
        (
            {"handler": "test.noop", "every": 5, "args": {"s": "x" * 200}},
            "over the limit of 100",  # MAX_ARGS_BYTES, set to 100 below
        ),
        (
            {"handler": "test.noop", "every": 5, "args": {"d": _deep(30)}},
            "more than 30 levels",
        ),
    ],
)
def test_a_bad_schedule_is_a_system_check_error(settings, raw, message):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "MAX_ARGS_BYTES": 100, "SCHEDULES": {"bad": raw}}
    errors = check_schedules()
    assert [e.id for e in errors] == ["django_jobqueue.E010"], errors
    assert "JOBQUEUE['SCHEDULES']['bad']" in errors[0].msg
    assert message in errors[0].msg
    with pytest.raises(ImproperlyConfigured, match="'bad'"):
        schedules.configured()


def test_a_schedule_name_with_control_characters_is_a_system_check_error(settings):
    raw = {"handler": "test.noop", "every": 5}
    settings.JOBQUEUE = {**settings.JOBQUEUE, "SCHEDULES": {"a\x1b[2Jb": raw}}
    errors = check_schedules()
    assert [e.id for e in errors] == ["django_jobqueue.E010"], errors
    assert "must not contain control characters" in errors[0].msg
    assert "\x1b" not in errors[0].msg  # the name is shown escaped


def test_the_longest_every_is_accepted(settings):
    raw = {"handler": "test.noop", "every": schedules.MAX_EVERY}
    settings.JOBQUEUE = {**settings.JOBQUEUE, "SCHEDULES": {"yearly": raw}}
    assert check_schedules() == []
    (found,) = schedules.configured()
    now = dt.datetime(2030, 6, 1, tzinfo=dt.UTC)
    assert now < found.next_after(now) <= now + dt.timedelta(seconds=schedules.MAX_EVERY)


def test_valid_schedules_pass_the_checks(settings):
    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "SCHEDULES": {
            "nightly": {
                "handler": "test.add",
                "cron": "0 3 * * *",
                "timezone": "Europe/Paris",
                "args": {"a": 1, "b": 2},
            },
            "poll": {"handler": "test.noop", "every": 30, "queue": "feeds", "priority": 5},
        },
    }
    assert not check_schedules() and not check_settings()
    assert [s.name for s in schedules.configured()] == ["nightly", "poll"]


def test_schedules_must_be_a_dict_of_dicts(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "SCHEDULES": {"x": "every minute"}}
    errors = [e for e in check_settings() if e.id == "django_jobqueue.E001"]
    assert errors and "SCHEDULES" in errors[0].msg


# -- one slot, one job ---------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_slot_is_taken_once_and_its_job_carries_the_slot_key():
    s = schedules.parse("poll", {"handler": "test.add", "every": 30, "args": {"a": 1, "b": 2}})
    dialect = get_dialect("default")
    schedule_runner.ensure_states(dialect, [s], at("2026-01-01T00:00:05+00:00"))
    now = at("2026-01-01T00:00:31+00:00")
    job = schedule_runner.take_slot(dialect, s, now)
    assert job is not None
    assert job.unique_key == "schedule:poll:2026-01-01T00:00:30+00:00"
    assert (job.type, job.args) == ("test.add", {"a": 1, "b": 2})
    assert schedule_runner.take_slot(dialect, s, now) is None  # the same slot again: nothing
    state = ScheduleState.objects.get(name="poll")
    assert (state.last_slot, state.enqueued_slot, state.job_id) == (
        at("2026-01-01T00:00:30+00:00"),
        at("2026-01-01T00:00:30+00:00"),
        job.pk,
    )
    assert Job.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_jobqueue_schedules_lists_next_runs_and_last_enqueued_slot(settings, tmp_path):
    clock_file = tmp_path / "clock.json"
    set_clock(clock_file, at("2026-01-01T10:00:05+00:00"))
    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "SCHEDULE_CLOCK": "tests.testapp.clock.now",
        "SCHEDULES": {
            "nightly": {"handler": "test.noop", "cron": "0 3 * * *", "timezone": "Europe/Paris"},
            "poll": {"handler": "test.noop", "every": 30},
        },
    }
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JOBQUEUE_TEST_CLOCK_FILE", str(clock_file))
        dialect = get_dialect("default")
        poll_schedule = schedules.configured()[1]
        schedule_runner.ensure_states(dialect, [poll_schedule], at("2026-01-01T09:59:00+00:00"))
        job = schedule_runner.take_slot(dialect, poll_schedule, at("2026-01-01T10:00:05+00:00"))
        out = StringIO()
        call_command("jobqueue_schedules", "--count", "2", stdout=out)
    text = out.getvalue()
    assert "nightly: test.noop, cron '0 3 * * *' (Europe/Paris), catch_up=once" in text
    assert "next:          2026-01-02T03:00:00+01:00" in text
    assert "next:          2026-01-03T03:00:00+01:00" in text
    assert "last enqueued: never" in text
    assert "poll: test.noop, every 30s" in text
    assert "next:          2026-01-01T10:00:30+00:00" in text
    assert f"last enqueued: 2026-01-01T10:00:00+00:00 (job {job.pk})" in text


# -- several workers over simulated time ---------------------------------------------------

SCHEDULES = {
    "minutely-once": {"handler": "test.noop", "cron": "* * * * *", "timezone": "Europe/Paris"},
    "minutely-skip": {
        "handler": "test.noop",
        "cron": "* * * * *",
        "catch_up": "skip",
        "grace": 10,
    },
    "every-20": {"handler": "test.add", "every": 20, "args": {"a": 1, "b": 2}},
}


def slots(start: str, end: str, step: int) -> list[str]:
    """The slots in (start, end] every `step` seconds, as in the jobs' unique keys."""
    moment, stop, found = at(start), at(end), []
    moment = moment + dt.timedelta(seconds=step - moment.timestamp() % step)
    while moment <= stop:
        found.append(moment.isoformat())
        moment += dt.timedelta(seconds=step)
    return found


def keys_of(name: str) -> list[str]:
    prefix = f"schedule:{name}:"
    return sorted(
        k.removeprefix(prefix)
        for k in Job.objects.filter(unique_key__startswith=prefix).values_list(
            "unique_key", flat=True
        )
    )


def walk_slots(
    clock_file: Path, want: dict[str, list[str]], after: dt.datetime | None = None
) -> None:
    """Stand the shared clock one second after each wanted slot (later than `after`) in turn,
    and wait until every schedule has exactly its slots up to there.

    The clock moves on only once the workers have acted: however busy the machine, no slot
    is missed for want of a tick (a clock running at 20x would leave "once" only the latest).
    """
    moments = sorted({at(s) for w in want.values() for s in w if after is None or at(s) > after})
    for moment in moments:
        set_clock(clock_file, moment + dt.timedelta(seconds=1))
        upto = {n: [s for s in w if at(s) <= moment] for n, w in want.items()}
        poll(lambda u=upto: all(keys_of(n) == w for n, w in u.items()), timeout=60, interval=0.1)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_three_workers_enqueue_each_slot_once_and_honour_catch_up(start_worker, tmp_path: Path):
    """Three worker processes share a simulated clock: over 5 minutes across the Paris
    daylight-saving jump every slot is enqueued exactly once; after a 10-minute gap "once"
    enqueues the latest missed slot and "skip" none; then slots continue as before."""
    clock_file = tmp_path / "clock.json"
    start = at("2026-03-29T00:57:30+00:00")  # 01:57:30 CET; Paris jumps to CEST at 01:00 UTC
    set_clock(clock_file, start)
    for name in SCHEDULES:
        ScheduleState.objects.create(name=name, last_slot=start)
    env = {
        "JOBQUEUE_TEST_CLOCK_FILE": str(clock_file),
        "JOBQUEUE_TEST_SCHEDULES": json.dumps(SCHEDULES),
    }
    fleet = [start_worker("--concurrency", "2", *FAST, env=env) for _ in range(3)]
    for worker in fleet:
        worker.wait_registered()

    # Five simulated minutes, slot by slot (a clock that never outruns a busy machine).
    want = {
        "minutely-once": slots("2026-03-29T00:57:30+00:00", "2026-03-29T01:02:30+00:00", 60),
        "minutely-skip": slots("2026-03-29T00:57:30+00:00", "2026-03-29T01:02:30+00:00", 60),
        "every-20": slots("2026-03-29T00:57:30+00:00", "2026-03-29T01:02:30+00:00", 20),
    }
    assert len(want["minutely-once"]) == 5 and len(want["every-20"]) == 15
    walk_slots(clock_file, want)

    # A gap: ten minutes pass with no slot enqueued (as if no worker ran), found 25 s late.
    gap_end = at("2026-03-29T01:13:25+00:00")
    set_clock(clock_file, gap_end)
    want["minutely-once"].append("2026-03-29T01:13:00+00:00")  # the latest missed slot, once
    want["every-20"].append("2026-03-29T01:13:20+00:00")  # 5 s late: "once" (the default)
    poll(lambda: all(keys_of(n) == w for n, w in want.items()), timeout=60, interval=0.2)
    # "skip" moved past the missed slots without enqueueing any (grace 10 s < 25 s late).
    poll(lambda: ScheduleState.objects.get(name="minutely-skip").last_slot == at(
        "2026-03-29T01:13:00+00:00"
    ))  # fmt: skip

    # Two more minutes: every schedule carries on from where it stands.
    want["minutely-once"] += slots("2026-03-29T01:13:25+00:00", "2026-03-29T01:15:25+00:00", 60)
    want["minutely-skip"] += slots("2026-03-29T01:13:25+00:00", "2026-03-29T01:15:25+00:00", 60)
    want["every-20"] += slots("2026-03-29T01:13:25+00:00", "2026-03-29T01:15:25+00:00", 20)
    walk_slots(clock_file, want, after=gap_end)
    poll(lambda: not Job.objects.exclude(state=Job.State.DONE).exists(), timeout=60)

    for worker in fleet:
        assert worker.stop() == 0, worker.output()
        assert_clean_log(worker.output())
    assert all(keys_of(n) == w for n, w in want.items())  # nothing more came meanwhile
    counts = Counter(Job.objects.values_list("unique_key", flat=True))
    assert counts and max(counts.values()) == 1
    assert set(Job.objects.filter(type="test.add").values_list("result", flat=True)) == {3}
    # Every worker's scheduler took part (no leader): the jobs' slots were enqueued by more
    # than one of them, which the log lines show.
    enqueuers = [w for w in fleet if "Schedule every-20: enqueued job" in w.output()]
    print(f"{len(enqueuers)} of 3 workers enqueued slots")
    assert len(enqueuers) >= 2


# -- Django tasks and the decorator --------------------------------------------------------


@requires_tasks
@pytest.mark.django_db(transaction=True)
def test_a_schedule_can_name_a_django_task(settings):
    from django_jobqueue.backends import task_key

    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "SCHEDULES": {
            "sum": {"task": "tests.testapp.tasks.add", "every": 10, "args": {"a": 2, "b": 3}}
        },
    }
    (s,) = schedules.configured()
    assert s.handler == task_key("default", "tests.testapp.tasks.add")
    dialect = get_dialect("default")
    schedule_runner.ensure_states(dialect, [s], at("2026-01-01T00:00:00+00:00"))
    job = schedule_runner.take_slot(dialect, s, at("2026-01-01T00:00:10+00:00"))
    assert job is not None and job.unique_key == "schedule:sum:2026-01-01T00:00:10+00:00"
    # A worker of its own would run the schedule by the real clock: without it, just the job.
    settings.JOBQUEUE = {**settings.JOBQUEUE, "SCHEDULES": {}}
    assert run_burst() == 0
    assert Job.objects.count() == 1
    job.refresh_from_db()
    assert (job.state, job.result) == ("done", 5)


@requires_tasks
@pytest.mark.django_db(transaction=True)
def test_a_schedule_of_a_django_task_gives_its_jobs_the_resources_it_uses(settings):
    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "LIMITS": {"api": {"concurrency": 2}, "tenant:*": {"concurrency": 1}},
        "SCHEDULES": {
            "sum": {
                "task": "tests.testapp.tasks.add",
                "every": 10,
                "args": {"a": 2, "b": 3},
                "uses": {"api": 1, "tenant:7": 1},
            }
        },
    }
    (s,) = schedules.configured()
    dialect = get_dialect("default")
    schedule_runner.ensure_states(dialect, [s], at("2026-01-01T00:00:00+00:00"))
    job = schedule_runner.take_slot(dialect, s, at("2026-01-01T00:00:10+00:00"))
    assert job is not None
    job.refresh_from_db()
    assert job.uses == {"api": 1, "tenant:7": 1}


@requires_tasks
@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"task": "tests.testapp.tasks.nope", "every": 5}, "cannot be imported"),
        ({"task": "tests.testapp.jobs.add", "every": 5}, "is not a task of"),
        ({"task": "tests.testapp.tasks.add", "handler": "test.add", "every": 5}, "not both"),
    ],
)
def test_a_bad_task_schedule_is_a_check_error(settings, raw, message):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "SCHEDULES": {"bad": raw}}
    (error,) = check_schedules()
    assert message in error.msg


@pytest.fixture
def declared():
    """Forget what a test declares with @jobqueue.schedule or registers as a handler."""
    before = dict(schedules._declared)
    yield
    schedules._declared.clear()
    schedules._declared.update(before)
    registry.unregister("test.scheduled_add")


def test_the_decorator_schedules_the_handler_below_it(declared, settings):
    @jobqueue.schedule("deco", every=5, args={"a": 1, "b": 1}, queue="feeds")
    @jobqueue.handler("test.scheduled_add")
    def scheduled_add(a: int, b: int) -> int:
        return a + b

    (s,) = schedules.configured()
    assert (s.name, s.handler, s.every, s.args, s.queue) == (
        "deco", "test.scheduled_add", 5, {"a": 1, "b": 1}, "feeds",
    )  # fmt: skip
    assert not check_schedules()
    # The same name in settings as well: which one is meant is unclear, so it is an error.
    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "SCHEDULES": {"deco": {"handler": "test.noop", "every": 9}},
    }
    assert "also declared with @jobqueue.schedule" in check_schedules()[0].msg


def test_the_decorator_needs_a_registered_handler_below_it(declared):
    def loose() -> None:
        return None

    with pytest.raises(HandlerRegistrationError, match=r"above @jobqueue\.handler"):
        jobqueue.schedule("loose", every=5)(loose)
    assert "loose" not in schedules._declared


@requires_tasks
def test_the_decorator_schedules_a_task(declared):
    from tests.testapp import tasks

    jobqueue.schedule("task-deco", cron="0 * * * *", args={"a": 1, "b": 2})(tasks.add)
    (s,) = schedules.configured()
    assert s.task == "tests.testapp.tasks.add" and s.cron == "0 * * * *"


@pytest.mark.django_db
def test_the_schedules_command_with_none_and_with_bad_options(settings):
    """No schedules is said plainly; a bad --count or a bad SCHEDULES is a CommandError."""
    from django.core.management.base import CommandError

    settings.JOBQUEUE = {"SCHEDULES": {}}
    out = StringIO()
    call_command("jobqueue_schedules", stdout=out)
    assert out.getvalue().strip() == "No schedules (JOBQUEUE['SCHEDULES'] is empty)."
    with pytest.raises(CommandError, match="--count must be at least 1"):
        call_command("jobqueue_schedules", "--count", "0", stdout=StringIO())
    settings.JOBQUEUE = {"SCHEDULES": {"broken": {"handler": "test.noop"}}}
    with pytest.raises(CommandError, match="broken"):
        call_command("jobqueue_schedules", stdout=StringIO())
