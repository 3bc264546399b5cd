"""Every name and key that reaches the database passes one check (validation.name_problem)
before anything is written: text that cannot be encoded as UTF-8 (a lone surrogate), NUL and
the other control characters, a "*" inside a resource name, empty and over-long names are
refused with each entry point's documented error, which prints the name escaped, and the
caller's transaction stays usable (issue 46: a lone surrogate in `uses` was accepted and
stopped every claim on SQLite, raised DataError on PostgreSQL and MariaDB)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from io import StringIO
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db import connections, transaction
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext

import django_jobqueue as jobqueue
from django_jobqueue import checks, registry, schedules, validation
from django_jobqueue.admin.limits import LimitActionForm
from django_jobqueue.backends import HAS_TASKS
from django_jobqueue.exceptions import (
    HandlerRegistrationError,
    InvalidJobError,
    UnknownHandlerError,
)
from django_jobqueue.models import Job, JobEvent, JobStep, LimitSetting, QueueState, Worker
from django_jobqueue.testing import run_jobs
from tests.support.admin_support import url
from tests.testapp.models import RunRecord
from tests.testapp.name_jobs import BAD_NAMES, INNER_STAR, RESOURCE_NAMES

pytestmark = pytest.mark.django_db

LIMITS = {"api": {"concurrency": 2}, "tenant:*": {"concurrency": 1}}

# A resource takes none of RESOURCE_NAMES; every other name none of BAD_NAMES but "empty"
# where it may be empty (a group); a "*" is a character like another there.
NOT_EMPTY = {case: name for case, name in BAD_NAMES.items() if case != "empty"}


@pytest.fixture(autouse=True)
def limits(settings: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "LIMITS": LIMITS}


def assert_printable(message: str) -> None:
    """The error says what is wrong without writing the name raw (a terminal, a log, a UTF-8
    page take what it holds)."""
    message.encode("utf-8")
    assert not validation.UNSAFE_CHARS.search(message), message


@contextmanager
def refused(error: type[BaseException], using: str = "default") -> Any:
    """Expect `error` from the block, with a printable message, and no statement sent to the
    database (a failed one would break the caller's transaction on PostgreSQL)."""
    with CaptureQueriesContext(connections[using]) as seen, pytest.raises(error) as info:
        yield info
    assert_printable(str(info.value))
    assert [q["sql"] for q in seen.captured_queries] == []


def usable() -> bool:
    """Whether the current transaction still runs queries (it is not marked for rollback)."""
    return RunRecord.objects.count() >= 0


# -- enqueue-time input: InvalidJobError, nothing written, the transaction usable --------------


def _graph_add(**options: Any) -> Job:
    with jobqueue.graph() as g:
        return g.add("limits.work", **options)


def _task(**options: Any) -> Any:
    from tests.testapp import tasks

    return tasks.add.using(**options).enqueue(1, 2)


ENQUEUES: dict[str, Callable[..., Any]] = {
    "enqueue": lambda **o: jobqueue.enqueue("limits.work", **o),
    "enqueue_many": lambda **o: jobqueue.enqueue_many([{"type": "limits.work", **o}]),
    "graph.add": _graph_add,
}
if HAS_TASKS:  # django.tasks, Django 6.0 on
    ENQUEUES["task.using"] = lambda **o: _task(
        **{"queue_name" if k == "queue" else k: v for k, v in o.items()}
    )
# The option, and the cases it refuses.
OPTIONS = {
    "uses": RESOURCE_NAMES,
    "queue": BAD_NAMES,
    "group": NOT_EMPTY,
    "unique_key": BAD_NAMES,
}
ENQUEUE_CASES = [
    pytest.param(entry, option, case, id=f"{entry}-{option}-{case}")
    for entry in ENQUEUES
    for option, cases in OPTIONS.items()
    for case in cases
    # Graph.add() takes no unique_key; Django's own checks refuse a queue_name its TASKS
    # setting does not list (InvalidTask).
    if (entry, option) not in {("graph.add", "unique_key"), ("task.using", "queue")}
]


def option_value(option: str, name: str) -> Any:
    return {name: 1} if option == "uses" else name


@pytest.mark.parametrize(("entry", "option", "case"), ENQUEUE_CASES)
def test_a_bad_name_is_refused_at_enqueue_and_the_transaction_goes_on(
    entry: str, option: str, case: str
) -> None:
    name = RESOURCE_NAMES[case]
    with transaction.atomic():
        RunRecord.objects.create(job_id=0, attempt=1)
        with refused(InvalidJobError):
            ENQUEUES[entry](**{option: option_value(option, name)})
        assert usable()
        good = ENQUEUES[entry](uses={"tenant:42": 1})  # the same transaction takes a good job
    assert Job.objects.count() == 1
    assert RunRecord.objects.count() == 1
    assert good is not None


@pytest.mark.parametrize("case", RESOURCE_NAMES)
def test_a_handler_default_uses_with_a_bad_name_is_refused(case: str) -> None:
    with transaction.atomic():
        with refused(InvalidJobError):
            jobqueue.enqueue("names.default_uses", {"case": case})
        assert usable()
        jobqueue.enqueue("names.default_uses", {"case": "escape"}, uses={"api": 1})
    assert Job.objects.count() == 1


@pytest.mark.parametrize("case", INNER_STAR)
def test_a_star_is_a_character_in_names_that_are_not_resources(case: str) -> None:
    """Only a resource gives "*" a meaning: a queue, group or key may hold one."""
    name = INNER_STAR[case]
    job = jobqueue.enqueue("limits.work", queue=name, group=name, unique_key=name)
    assert (job.queue, job.group_key, job.unique_key) == (name, name, name)
    assert jobqueue.send_event(name) is True


@pytest.mark.parametrize("case", BAD_NAMES)
def test_a_bad_handler_key_is_refused_at_registration_and_at_enqueue(case: str) -> None:
    name = BAD_NAMES[case]
    with pytest.raises(HandlerRegistrationError) as info:
        registry.handler(name)(lambda: None)
    assert_printable(str(info.value))
    with refused(UnknownHandlerError):
        jobqueue.enqueue(name)
    with refused(InvalidJobError):
        jobqueue.enqueue_many([(name, {})])
    assert name not in registry.allowlist()


@pytest.mark.parametrize("case", BAD_NAMES)
def test_a_bad_event_key_or_container_name_is_refused(case: str) -> None:
    name = BAD_NAMES[case]
    with transaction.atomic():
        with refused(InvalidJobError):
            jobqueue.send_event(name, {"ok": True})
        with refused(InvalidJobError), jobqueue.container(name):
            pass
        with refused(InvalidJobError), jobqueue.graph() as g:
            g.container(name)
        assert usable()
    assert not JobEvent.objects.exists()
    assert not Job.objects.exists()


@pytest.mark.parametrize("case", ["lone-surrogate", "nul", "empty", "too-long"])
def test_a_bad_effect_key_is_refused(case: str) -> None:
    """An effect key is the application's own and never printed: only what no column takes
    is refused (a control character is allowed)."""
    with transaction.atomic():
        with refused(InvalidJobError):
            jobqueue.record_effect(BAD_NAMES[case])
        assert usable()
        assert jobqueue.record_effect("tenant:\x1b") is True


def test_printable_escapes_what_a_terminal_or_utf_8_cannot_take() -> None:
    assert validation.printable("a\x1b[2J\n\u202e\ud800b") == "a\\x1b[2J\\n\\u202e\\ud800b"
    assert (
        validation.printable("zwj: \u200d, emoji: \U0001f600") == "zwj: \u200d, emoji: \U0001f600"
    )


DURABLE_CASES = [
    pytest.param(call, case, id=f"{call}-{case}")
    for call, cases in {
        "step": BAD_NAMES,
        "wait_for_event": BAD_NAMES,
        "spawn-uses": RESOURCE_NAMES,
        "spawn-queue": BAD_NAMES,
        "spawn-group": NOT_EMPTY,
        "spawn-unique_key": BAD_NAMES,
        "spawn-key": BAD_NAMES,
    }.items()
    for case in cases
]


@pytest.mark.parametrize(("call", "case"), DURABLE_CASES)
def test_a_bad_name_in_a_durable_call_is_refused_in_the_handler(call: str, case: str) -> None:
    job = jobqueue.enqueue("names.durable_call", {"call": call, "case": case})
    run_jobs()
    job.refresh_from_db()
    assert job.state == Job.State.DONE
    refusal = job.result
    expected = "UnknownHandlerError" if call == "spawn-key" else "InvalidJobError"
    assert refusal["refused"] == expected, refusal
    assert_printable(refusal["message"])
    assert refusal["writes"] == []
    assert Job.objects.count() == 1  # no child
    assert not JobStep.objects.exists()  # no record of a step, a wait or a spawn
    assert not JobEvent.objects.exists()


# -- RateLimited: TypeError or ValueError where it is built -------------------------------------


@pytest.mark.parametrize("case", [*RESOURCE_NAMES, "pattern"])
def test_rate_limited_refuses_a_bad_resource_with_value_error(case: str) -> None:
    name = "tenant:*" if case == "pattern" else RESOURCE_NAMES[case]
    with pytest.raises(ValueError, match="RateLimited resource") as info:
        jobqueue.RateLimited(name, retry_after=1)
    assert_printable(str(info.value))


def test_rate_limited_refuses_a_resource_that_is_not_a_string_with_type_error() -> None:
    with pytest.raises(TypeError):
        jobqueue.RateLimited(b"tenant:1", retry_after=1)  # type: ignore[arg-type]
    assert jobqueue.RateLimited("tenant:1", retry_after=1).resource == "tenant:1"


# -- settings: the system checks ---------------------------------------------------------------


SETTINGS_CASES = (
    [
        pytest.param({"LIMITS": {name: {"concurrency": 1}}}, id=f"LIMITS-{case}")
        for case, name in RESOURCE_NAMES.items()
    ]
    + [
        pytest.param({setting: {name: value}}, id=f"{setting}-{case}")
        for setting, value in (("GROUP_LIMITS", 1), ("QUEUE_LIMITS", 1), ("RATE_LIMITS", "1/s"))
        for case, name in BAD_NAMES.items()
    ]
    + [
        pytest.param({"DEFAULT_QUEUE": name}, id=f"DEFAULT_QUEUE-{case}")
        for case, name in BAD_NAMES.items()
    ]
)


@pytest.mark.parametrize("jobqueue_setting", SETTINGS_CASES)
def test_a_bad_name_in_the_settings_is_a_check_error(jobqueue_setting: dict[str, Any]) -> None:
    with override_settings(JOBQUEUE=jobqueue_setting):
        found = checks.check_settings()
    assert [m.id for m in found] == ["django_jobqueue.E001"]
    assert_printable(found[0].msg)


def test_a_pattern_ends_with_its_star_in_the_settings() -> None:
    one = {"concurrency": 1}
    with override_settings(JOBQUEUE={"LIMITS": {"tenant:*": one, "a*b*": one}}):
        assert [m.id for m in checks.check_settings()] == ["django_jobqueue.E001"]
    with override_settings(JOBQUEUE={"LIMITS": {"tenant:*": one}}):
        assert checks.check_settings() == []


@pytest.mark.parametrize("case", RESOURCE_NAMES)
def test_a_bad_schedule_name_or_uses_is_refused(case: str) -> None:
    name = RESOURCE_NAMES[case]
    with pytest.raises(ImproperlyConfigured) as info:
        schedules.parse("s", {"handler": "limits.work", "every": 60, "uses": {name: 1}})
    assert_printable(str(info.value))
    if case in BAD_NAMES:
        with pytest.raises(ImproperlyConfigured) as info:
            schedules.parse(name, {"handler": "limits.work", "every": 60})
        assert_printable(str(info.value))


# -- commands: CommandError before anything is written ----------------------------------------


LIMIT_COMMANDS = [
    pytest.param(argv(name), id=f"{argv(name)[0]}-{case}")
    for argv in (lambda n: ["set", n, "--concurrency", "1"], lambda n: ["reset", n])
    for case, name in RESOURCE_NAMES.items()
]


@pytest.mark.parametrize("argv", LIMIT_COMMANDS)
def test_jobqueue_limits_refuses_a_bad_name(argv: list[str]) -> None:
    with pytest.raises(CommandError) as info:
        call_command("jobqueue_limits", *argv, stdout=StringIO())
    assert_printable(str(info.value))
    assert not LimitSetting.objects.exists()


@pytest.mark.parametrize("case", BAD_NAMES)
@pytest.mark.parametrize("command", ["jobqueue_pause", "jobqueue_resume"])
def test_pause_and_resume_refuse_a_bad_queue(command: str, case: str) -> None:
    with pytest.raises(CommandError) as info:
        call_command(command, "ok", BAD_NAMES[case], stdout=StringIO())
    assert_printable(str(info.value))
    assert not QueueState.objects.exists()


@pytest.mark.parametrize("case", BAD_NAMES)
@pytest.mark.parametrize("option", ["--queue", "--worker-id"])
def test_the_worker_refuses_a_bad_queue_or_worker_id(option: str, case: str) -> None:
    with pytest.raises(CommandError) as info:
        call_command("jobqueue_worker", option, BAD_NAMES[case], "--burst")
    assert_printable(str(info.value))
    assert not Worker.objects.live().exists()


# -- the admin's Limits page: a form error, nothing changed -----------------------------------


@pytest.mark.parametrize("case", RESOURCE_NAMES)
@pytest.mark.parametrize("action", ["set", "reset", "reopen", "pause", "resume"])
def test_the_limits_page_form_refuses_a_bad_name(action: str, case: str) -> None:
    name = RESOURCE_NAMES[case]
    form = LimitActionForm({"action": action, "name": name, "concurrency": "1"})
    # A "*" is a character in a queue's name (pause, resume); in a limit's, it ends a pattern.
    if case in INNER_STAR and action in ("pause", "resume"):
        assert form.is_valid()
        return
    assert not form.is_valid()
    assert form.errors["name"]
    for message in form.errors["name"]:
        assert_printable(message)


@pytest.mark.parametrize("case", ["escape", "bidi-override", "inner-star"])
def test_the_limits_page_says_nothing_was_changed(admin_client: Client, case: str) -> None:
    """Posted for real (a lone surrogate or NUL does not survive the form's encoding)."""
    data = {"action": "set", "name": RESOURCE_NAMES[case], "concurrency": "1"}
    response = admin_client.post(url("limit_changelist"), data, follow=True)
    assert "Nothing was changed" in response.content.decode()
    assert not LimitSetting.objects.exists()
