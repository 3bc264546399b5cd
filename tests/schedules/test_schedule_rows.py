"""Schedules stored as rows (`jobqueue_schedules add|pause|resume|remove|run`): checked as the
settings' are before anything is written, honoured by running workers within seconds with
each slot enqueued once; pause and run now on any schedule."""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from collections import Counter
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_jobqueue import schedule_rows, schedules
from django_jobqueue.dialects import get_dialect
from django_jobqueue.exceptions import ScheduleError
from django_jobqueue.models import Job, ScheduleDefinition, ScheduleState
from django_jobqueue.worker import schedule_runner
from tests.conftest import assert_clean_log, poll
from tests.support.workflow_support import FAST
from tests.testapp.clock import set_clock

UTC = dt.UTC
START = dt.datetime(2026, 1, 1, 0, 0, 5, tzinfo=UTC)
SETTINGS_SCHEDULE = {"handler": "test.noop", "cron": "0 3 * * *", "timezone": "Europe/Paris"}


@pytest.fixture
def clock(settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The schedules' clock of this process (and of workers given JOBQUEUE_TEST_CLOCK_FILE),
    standing still at START; one schedule in the settings."""
    path = tmp_path / "clock.json"
    set_clock(path, START)
    monkeypatch.setenv("JOBQUEUE_TEST_CLOCK_FILE", str(path))
    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "SCHEDULE_CLOCK": "tests.testapp.clock.now",
        "SCHEDULES": {"nightly": SETTINGS_SCHEDULE},
    }
    return path


def run(*args: str) -> str:
    out = StringIO()
    call_command("jobqueue_schedules", *args, stdout=out)
    return out.getvalue()


def keys_of(name: str) -> list[str]:
    prefix = f"schedule:{name}:"
    found = Job.objects.filter(unique_key__startswith=prefix).values_list("unique_key", flat=True)
    return sorted(k.removeprefix(prefix)[11:19] for k in found)  # the slots' times of day


def times(start: str, end: str, step: int) -> list[str]:
    """The slots in (start, end] of 2026-01-01 every `step` seconds, as HH:MM:SS."""
    moment = dt.datetime.fromisoformat(f"2026-01-01T{start}+00:00")
    stop = dt.datetime.fromisoformat(f"2026-01-01T{end}+00:00")
    moment += dt.timedelta(seconds=step - moment.timestamp() % step)
    found = []
    while moment <= stop:
        found.append(moment.strftime("%H:%M:%S"))
        moment += dt.timedelta(seconds=step)
    return found


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(f"2026-01-01T{text}+00:00")


def walk_slots(clock: Path, slots: list[str], before: list[str]) -> None:
    """Stand the shared clock one second after each of `slots` in turn, and wait until the
    schedule "every-20" has exactly `before` and the slots up to there.

    The clock moves on only once the workers have acted: however busy the machine, no slot
    is missed for want of a tick (a clock running at 20x would leave "once" only the latest).
    """
    for k, slot in enumerate(slots, 1):
        set_clock(clock, at(slot) + dt.timedelta(seconds=1))
        want = sorted(before + slots[:k])
        poll(lambda w=want: keys_of("every-20") == w, timeout=60, interval=0.1)


# -- storing, checked as the settings' are -------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("name", "raw", "message"),
    [
        ("x", {"handler": "no.such", "every": 5}, "No handler is registered under 'no.such'"),
        ("x", {"handler": "test.noop", "cron": "61 * * * *"}, "not a valid cron expression"),
        ("x", {"handler": "test.noop"}, "exactly one of 'cron'"),
        ("x", {"handler": "test.noop", "every": 5, "when": 1}, "unknown key(s) 'when'"),
        ("x", {"handler": "test.noop", "every": 5, "timezone": "UTC"}, "applies to 'cron'"),
        ("x", {"handler": "test.noop", "every": 5, "uses": {"nope": 1}}, "nope"),
        ("x", {"handler": "test.noop", "every": 5, "task": "t" * 300}, "not both"),
        ("", {"handler": "test.noop", "every": 5}, "schedule name"),
        ("a\x1b[2J", {"handler": "test.noop", "every": 5}, "control characters"),
        ("nightly", {"handler": "test.noop", "every": 5}, "taken by a schedule of JOBQUEUE"),
    ],
)
def test_a_bad_or_clashing_schedule_is_refused_and_nothing_written(clock, name, raw, message):
    with pytest.raises(ScheduleError) as caught:
        schedule_rows.add(name, raw)
    assert message in str(caught.value)
    assert not ScheduleDefinition.objects.exists() and not ScheduleState.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_stored_schedule_is_listed_beside_the_settings_ones_and_replaced_only_when_asked(clock):
    raw = {"handler": "test.add", "every": 30, "args": {"a": 1, "b": 2}, "queue": "feeds"}
    stored = schedule_rows.add("poll", raw)
    assert stored == schedules.parse("poll", raw)  # the same Schedule as in the settings
    state = ScheduleState.objects.get(name="poll")
    assert state.last_slot == START and not state.paused  # its first slot is after now
    with pytest.raises(ScheduleError, match="exists already: change it with --replace"):
        schedule_rows.add("poll", {"handler": "test.noop", "every": 60})
    assert ScheduleDefinition.objects.get(name="poll").every == 30
    schedule_rows.add("poll", {"handler": "test.noop", "every": 60}, replace=True)
    row = ScheduleDefinition.objects.get(name="poll")
    assert (row.handler, row.every, row.args, row.queue) == ("test.noop", 60, {}, None)

    text = run("--count", "2")
    assert "nightly: test.noop, cron '0 3 * * *' (Europe/Paris), catch_up=once" in text
    assert "poll: test.noop, every 60s, catch_up=once\n  stored:        in the database\n" in text
    assert "  next:          2026-01-01T00:01:00+00:00\n" in text
    assert "  next:          2026-01-01T00:02:00+00:00\n" in text
    # The settings' schedule lists as it did (no stored line).
    nightly = text[text.index("nightly:") : text.index("poll:")]
    assert nightly.splitlines()[1:] == [
        "  next:          2026-01-01T03:00:00+01:00",
        "  next:          2026-01-02T03:00:00+01:00",
        "  last enqueued: never",
    ]


@pytest.mark.django_db(transaction=True)
def test_the_command_adds_pauses_resumes_runs_and_removes(clock):
    out = run(
        "add", "report", "--handler", "test.add", "--cron", "*/5 * * * *", "--timezone", "UTC",
        "--args", '{"a": 2, "b": 3}', "--priority", "4", "--catch-up", "skip", "--grace", "30",
    )  # fmt: skip
    assert out == (
        "Stored schedule 'report': test.add, cron '*/5 * * * *' (UTC). "
        "Workers run it within seconds.\n"
    )
    s = schedule_rows.find("report")
    assert (s.args, s.priority, s.catch_up, s.grace) == ({"a": 2, "b": 3}, 4, "skip", 30.0)

    assert run("pause", "report").startswith("Paused schedule 'report'")
    assert run("pause", "report") == "Schedule 'report' was paused already.\n"
    assert "  paused since:  2026-01-01T00:00:05+00:00" in run()
    # Any schedule pauses, one of the settings too.
    assert run("pause", "nightly").startswith("Paused schedule 'nightly'")
    assert ScheduleState.objects.get(name="nightly").paused
    assert run("resume", "nightly").startswith("Resumed schedule 'nightly'")
    assert run("resume", "nightly") == "Schedule 'nightly' was not paused.\n"

    out = run("run", "report")
    job = Job.objects.get()
    assert out.startswith(f"Enqueued job {job.pk} of schedule 'report' (outside its slots")
    assert (job.type, job.args, job.priority, job.unique_key) == (
        "test.add",
        {"a": 2, "b": 3},
        4,
        None,
    )
    listing = run()
    assert f"  run now:       2026-01-01T00:00:05+00:00 (job {job.pk})" in listing
    assert f"  last outcome:  ready (job {job.pk})" in listing

    assert run("remove", "report") == "Removed schedule 'report'.\n"
    assert not ScheduleState.objects.filter(name="report").exists()
    for args, message in [
        (("remove", "report"), "No stored schedule is named 'report'"),
        (("remove", "nightly"), "remove it from the code, or pause it"),
        (("pause", "nope"), "No schedule is named 'nope'"),
        (("resume", "nope"), "No schedule is named 'nope'"),
        (("run", "nope"), "No schedule is named 'nope'"),
        (("add", "x", "--handler", "test.noop"), "exactly one of 'cron'"),
        (
            ("add", "x", "--handler", "test.noop", "--every", "5", "--args", "{"),
            "--args is not JSON",
        ),
        (("add", "nightly", "--handler", "test.noop", "--every", "5"), "choose another name"),
    ]:
        with pytest.raises(CommandError, match=message):
            run(*args)
    assert "report" not in run()


@pytest.mark.django_db(transaction=True)
def test_a_stored_schedules_name_and_problem_are_shown_escaped(clock):
    ScheduleDefinition.objects.create(name="gone\x1b[2J", handler="no.more", every=5)
    ScheduleDefinition.objects.create(name="gone", handler="no.more", every=5)
    text = run()
    assert "gone: not run: Stored schedule 'gone': No handler is registered" in text
    assert "gone\\x1b[2J: not run: Stored schedule 'gone\\x1b[2J': a schedule name" in text
    assert "\x1b" not in text


# -- pause and run now at the slot ---------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_paused_schedule_takes_no_slot_and_resumes_without_the_missed_ones(clock):
    s = schedule_rows.add("poll", {"handler": "test.noop", "every": 30})
    dialect = get_dialect("default")
    assert schedule_rows.pause("poll")
    assert schedule_runner.take_slot(dialect, s, at("00:00:31")) is None
    assert schedule_runner.take_slot(dialect, s, at("00:02:01")) is None
    assert not Job.objects.exists()
    set_clock(clock, at("00:02:10"))
    assert schedule_rows.resume("poll")
    state = ScheduleState.objects.get(name="poll")
    assert state.last_slot == at("00:02:10") and state.paused_at is None
    assert schedule_runner.take_slot(dialect, s, at("00:02:20")) is None  # 00:02:00 missed
    job = schedule_runner.take_slot(dialect, s, at("00:02:31"))
    assert job is not None and job.unique_key == "schedule:poll:2026-01-01T00:02:30+00:00"


@pytest.mark.django_db(transaction=True)
def test_run_now_takes_no_slot_and_runs_a_paused_schedule_too(clock):
    s = schedule_rows.add("poll", {"handler": "test.noop", "every": 30}, paused=True)
    now_job = schedule_rows.run_now("poll")
    assert now_job.unique_key is None and now_job.type == "test.noop"
    nightly = schedule_rows.run_now("nightly")  # a settings schedule
    assert nightly.type == "test.noop"
    state = ScheduleState.objects.get(name="poll")
    assert (state.run_job_id, state.run_at, state.last_slot) == (now_job.pk, START, START)
    schedule_rows.resume("poll")
    dialect = get_dialect("default")
    slot_job = schedule_runner.take_slot(dialect, s, at("00:00:31"))
    assert slot_job is not None  # the slot is still there
    (standing,) = [
        x for x in schedule_rows.standings(get_dialect("default")) if x.schedule.name == "poll"
    ]
    assert (standing.outcome_job_id, standing.outcome) == (slot_job.pk, "ready")
    assert standing.stored and not standing.paused
    Job.objects.filter(pk=slot_job.pk).delete()  # pruned: said so
    (standing,) = [
        x for x in schedule_rows.standings(get_dialect("default")) if x.schedule.name == "poll"
    ]
    assert standing.outcome == "deleted"


# -- the worker's scheduler ----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_scheduler_skips_a_bad_or_clashing_row_and_says_so_once(clock, caplog):
    ScheduleDefinition.objects.create(name="broken", handler="no.such", every=5)
    ScheduleDefinition.objects.create(name="nightly", handler="test.noop", every=5)
    schedule_rows.add("good", {"handler": "test.noop", "every": 5})
    dialect = get_dialect("default")
    runner = schedule_runner.ScheduleRunner(
        dialect,
        schedules=schedules.configured(),
        clock=schedules.clock(dialect),
        interval=0.05,
        lock_timeout=5,
        refresh=0.0,
    )
    set_clock(clock, at("00:00:11"))
    with caplog.at_level(logging.ERROR, logger="django_jobqueue.worker.scheduler"):
        runner.tick()
        runner.tick()
    assert runner.schedules == [*schedules.configured(), schedule_rows.find("good")]
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert any("Schedule broken is not run" in m and "no.such" in m for m in messages)
    assert any("Schedule nightly is not run" in m and "is ignored" in m for m in messages)
    assert keys_of("good") == ["00:00:10"]
    assert not keys_of("nightly")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_three_workers_honour_stored_schedules_within_seconds_each_slot_once(clock, start_worker):
    """Three worker processes share a simulated clock. A schedule added while they run is
    honoured within seconds; over five simulated minutes each slot is enqueued exactly once;
    a pause, a change and a removal are honoured as well."""
    env = {"JOBQUEUE_TEST_CLOCK_FILE": str(clock)}
    fleet = [start_worker("--concurrency", "2", *FAST, env=env) for _ in range(3)]
    for worker in fleet:
        worker.wait_registered()

    # Added while they run: its first slot (00:00:20) is taken within seconds.
    added = time.monotonic()
    run("add", "every-20", "--handler", "test.add", "--every", "20", "--args", '{"a": 1, "b": 2}')
    set_clock(clock, at("00:00:21"))
    poll(lambda: keys_of("every-20") == ["00:00:20"], timeout=60, interval=0.1)
    print(f"first slot of the added schedule enqueued {time.monotonic() - added:.1f}s after add")

    # Five simulated minutes, slot by slot: every slot once.
    want = times("00:00:05", "00:05:21", 20)
    walk_slots(clock, want, [])

    # Paused: two minutes pass without a slot; resumed: the next slot after the resume runs.
    run("pause", "every-20")
    set_clock(clock, at("00:05:21"), speed=20, until=at("00:07:21"))
    poll(lambda: schedules.clock(get_dialect("default"))() == at("00:07:21"), timeout=60)
    time.sleep(3 * schedule_runner.REFRESH)  # time for any slot to be (wrongly) taken
    assert keys_of("every-20") == want
    run("resume", "every-20")
    walk_slots(clock, times("00:07:21", "00:08:21", 20), want)
    want += times("00:07:21", "00:08:21", 20)

    # Changed to every 30 s with the clock standing still; then a minute passes.
    run("add", "every-20", "--replace", "--handler", "test.add", "--every", "30",
        "--args", '{"a": 1, "b": 2}')  # fmt: skip
    time.sleep(3 * schedule_runner.REFRESH)  # every worker reads the rows again meanwhile
    walk_slots(clock, times("00:08:21", "00:09:21", 30), want)
    want += times("00:08:21", "00:09:21", 30)

    # Removed: no slot after it.
    run("remove", "every-20")
    set_clock(clock, at("00:09:21"), speed=20, until=at("00:10:21"))
    poll(lambda: schedules.clock(get_dialect("default"))() == at("00:10:21"), timeout=60)
    time.sleep(3 * schedule_runner.REFRESH)
    assert keys_of("every-20") == sorted(want)

    poll(lambda: not Job.objects.exclude(state=Job.State.DONE).exists(), timeout=60)
    for worker in fleet:
        assert worker.stop() == 0, worker.output()
        assert_clean_log(worker.output())
    counts = Counter(Job.objects.values_list("unique_key", flat=True))
    assert counts and max(counts.values()) == 1
    assert set(Job.objects.values_list("result", flat=True)) == {3}
    enqueuers = [w for w in fleet if "Schedule every-20: enqueued job" in w.output()]
    print(f"{len(enqueuers)} of 3 workers enqueued slots")


def test_json_dumps_of_a_row_is_stable():
    """The scheduler's cache key of a row does not depend on the order of its keys."""
    a = schedule_rows.raw_of({"handler": "h", "every": 5, "args": {"b": 1, "a": 2}})
    b = schedule_rows.raw_of({"args": {"a": 2, "b": 1}, "every": 5, "handler": "h"})
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
