"""Sequences (enqueue(sequence=...)): one key's jobs start one at a time, in enqueue order,
through `testing.run_jobs()` (the worker's own claim, run and record functions, in this
thread). With worker processes: tests/workflows/test_sequences_workers.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

import django_jobqueue as jobqueue
from django_jobqueue.engine import sequences
from django_jobqueue.exceptions import InvalidJobError
from django_jobqueue.models import Job, JobSequence
from django_jobqueue.testing import run_jobs
from tests.support.markers import only_sqlite

pytestmark = pytest.mark.django_db(transaction=True)


def events(marker: Path) -> list[str]:
    """The "start <n>" / "end <n>" lines of `marker`, without the pids."""
    return [" ".join(line.split()[:2]) for line in marker.read_text().splitlines()]


def starts(marker: Path) -> list[int]:
    return [int(e.split()[1]) for e in events(marker) if e.startswith("start")]


def state(job: Job) -> str:
    return Job.objects.values_list("state", flat=True).get(pk=job.pk)


def test_later_jobs_wait_held_until_the_head_is_final(tmp_path):
    marker = str(tmp_path / "m")
    a, b, c = (
        jobqueue.enqueue("seq.step", {"n": n, "marker": marker}, sequence="account:42")
        for n in (1, 2, 3)
    )
    assert [a.state, b.state, c.state] == ["ready", "waiting", "waiting"]
    assert JobSequence.objects.get(key="account:42").head == a.pk
    run_jobs()
    assert starts(tmp_path / "m") == [1, 2, 3]
    assert [state(j) for j in (a, b, c)] == ["done"] * 3
    # The sequence ran empty: its row went with it.
    assert not JobSequence.objects.exists()


def test_a_retry_keeps_its_place_and_a_higher_priority_does_not_pass(tmp_path):
    marker = tmp_path / "m"
    first = jobqueue.enqueue(
        "seq.step", {"n": 1, "marker": str(marker), "fail_once": True}, sequence="s"
    )
    jobqueue.enqueue("seq.step", {"n": 2, "marker": str(marker)}, sequence="s", priority=10)
    jobqueue.enqueue("test.noop", priority=5)  # a job of no sequence runs meanwhile
    run_jobs()
    assert starts(marker) == [1, 1, 2]
    assert Job.objects.get(pk=first.pk).attempts == 2


def test_a_durable_sleep_keeps_the_sequence(tmp_path):
    marker = tmp_path / "m"
    jobqueue.enqueue("seq.step", {"n": 1, "marker": str(marker), "sleep": 60}, sequence="s")
    second = jobqueue.enqueue("seq.step", {"n": 2, "marker": str(marker)}, sequence="s")
    run_jobs(ignore_delays=False)
    assert starts(marker) == [1]
    assert state(second) == "waiting"
    run_jobs()  # the sleep is over
    assert starts(marker) == [1, 1, 2]


def test_sequences_are_independent(tmp_path):
    marker = tmp_path / "m"
    a = jobqueue.enqueue("seq.step", {"n": 1, "marker": str(marker), "sleep": 60}, sequence="a")
    b = jobqueue.enqueue("seq.step", {"n": 2, "marker": str(marker)}, sequence="b")
    assert (a.state, b.state) == ("ready", "ready")
    run_jobs(ignore_delays=False)
    assert state(b) == "done"


def test_continue_lets_the_next_job_start_after_a_dead_one(tmp_path):
    marker = tmp_path / "m"
    dead = jobqueue.enqueue(
        "seq.step", {"n": 1, "marker": str(marker), "fail_always": True},
        sequence="s", max_attempts=1,
    )  # fmt: skip
    after = jobqueue.enqueue("seq.step", {"n": 2, "marker": str(marker)}, sequence="s")
    run_jobs()
    assert (state(dead), state(after)) == ("dead", "done")
    assert list(sequences.blocked("default")) == []


def test_block_holds_the_sequence_until_the_head_is_retried(tmp_path):
    marker = tmp_path / "m"
    head = jobqueue.enqueue(
        "seq.step", {"n": 1, "marker": str(marker), "fail_once": True},
        sequence="s", max_attempts=1, sequence_on_failure="block",
    )  # fmt: skip
    after = jobqueue.enqueue("seq.step", {"n": 2, "marker": str(marker)}, sequence="s")
    run_jobs()
    assert (state(head), state(after)) == ("dead", "waiting")
    assert list(sequences.blocked("default")) == [("s", head.pk)]
    late = jobqueue.enqueue("seq.step", {"n": 3, "marker": str(marker)}, sequence="s")
    assert late.state == "waiting"  # joins behind the blocked head
    jobqueue.retry(head)
    run_jobs()
    assert starts(marker) == [1, 1, 2, 3]
    assert [state(j) for j in (head, after, late)] == ["done"] * 3


def test_block_is_lifted_by_cancelling_the_head(tmp_path):
    marker = tmp_path / "m"
    head = jobqueue.enqueue(
        "seq.step", {"n": 1, "marker": str(marker), "fail_always": True},
        sequence="s", max_attempts=1, sequence_on_failure="block",
    )  # fmt: skip
    after = jobqueue.enqueue("seq.step", {"n": 2, "marker": str(marker)}, sequence="s")
    run_jobs()
    assert state(after) == "waiting"
    assert jobqueue.cancel(head) is True
    assert state(head) == "cancelled"
    run_jobs()
    assert state(after) == "done"


@override_settings(JOBQUEUE={"SEQUENCE_ON_FAILURE": "block"})
def test_the_setting_gives_the_default_and_a_job_may_override_it(tmp_path):
    marker = str(tmp_path / "m")
    blocking = jobqueue.enqueue("seq.step", {"n": 1, "marker": marker}, sequence="s")
    going = jobqueue.enqueue(
        "seq.step", {"n": 2, "marker": marker}, sequence="s", sequence_on_failure="continue"
    )
    assert Job.objects.get(pk=blocking.pk).sequence_blocks is True
    assert Job.objects.get(pk=going.pk).sequence_blocks is False


def test_cancelling_a_held_job_takes_it_out_of_the_order(tmp_path):
    marker = tmp_path / "m"
    jobqueue.enqueue("seq.step", {"n": 1, "marker": str(marker)}, sequence="s")
    middle = jobqueue.enqueue("seq.step", {"n": 2, "marker": str(marker)}, sequence="s")
    jobqueue.enqueue("seq.step", {"n": 3, "marker": str(marker)}, sequence="s")
    jobqueue.cancel(middle)
    run_jobs()
    assert starts(marker) == [1, 3]


def test_enqueue_many_and_graph_join_in_the_order_given(tmp_path):
    marker = str(tmp_path / "m")
    jobs = jobqueue.enqueue_many(
        [{"type": "seq.step", "args": {"n": n, "marker": marker}, "sequence": "s"}
         for n in (1, 2, 3)]
    )  # fmt: skip
    assert [j.state for j in jobs] == ["ready", "waiting", "waiting"]
    with jobqueue.graph() as g:
        up = g.add("seq.step", {"n": 4, "marker": marker}, sequence="s")
        g.add("seq.step", {"n": 5, "marker": marker}, sequence="t", depends_on=[up])
    run_jobs()
    assert starts(tmp_path / "m") == [1, 2, 3, 4, 5]


def test_unique_key_returns_the_holder_which_keeps_its_place(tmp_path):
    marker = str(tmp_path / "m")
    first = jobqueue.enqueue("seq.step", {"n": 1, "marker": marker}, sequence="s", unique_key="k")
    again = jobqueue.enqueue("seq.step", {"n": 9, "marker": marker}, sequence="s", unique_key="k")
    assert again.pk == first.pk
    assert Job.objects.filter(sequence="s").count() == 1


@pytest.mark.parametrize(
    "options, message",
    [
        ({"sequence": ""}, "sequence"),
        ({"sequence": "x" * 256}, "sequence"),
        ({"sequence": 42}, "sequence"),
        ({"sequence": "s", "sequence_on_failure": "stop"}, "sequence_on_failure"),
        ({"sequence_on_failure": "block"}, "without a sequence"),
    ],
)
def test_bad_sequence_options_are_refused_before_anything_is_written(options, message):
    with pytest.raises(InvalidJobError, match=message):
        jobqueue.enqueue("test.noop", **options)
    assert not Job.objects.exists()
    assert not JobSequence.objects.exists()


def test_jobs_without_a_sequence_never_touch_the_sequences(django_assert_max_num_queries):
    job = jobqueue.enqueue("test.noop")
    assert (job.sequence, job.has_dependents) == (None, False)
    run_jobs()
    assert not JobSequence.objects.exists()


def test_stats_show_a_blocked_sequence(tmp_path, capsys):
    head = jobqueue.enqueue(
        "seq.step", {"n": 1, "marker": str(tmp_path / "m"), "fail_always": True},
        sequence="s", max_attempts=1, sequence_on_failure="block",
    )  # fmt: skip
    jobqueue.enqueue("seq.step", {"n": 2, "marker": str(tmp_path / "m")}, sequence="s")
    run_jobs()
    call_command("jobqueue_stats", "--json")
    figures = json.loads(capsys.readouterr().out)
    assert figures["sequences"] == {"active": 1, "blocked": 1, "blocked_heads": {"s": head.pk}}
    assert any("sequence(s) blocked" in p for p in figures["problems"])
    call_command("jobqueue_stats")
    assert f"Sequences: 1 active, 1 blocked: s at job {head.pk}" in capsys.readouterr().out


def test_a_jobs_page_shows_its_sequence_head_and_queue(admin_client, tmp_path):
    marker = str(tmp_path / "m")
    head = jobqueue.enqueue(
        "seq.step", {"n": 1, "marker": marker, "fail_always": True},
        sequence="account:42", max_attempts=1, sequence_on_failure="block",
    )  # fmt: skip
    after = jobqueue.enqueue("seq.step", {"n": 2, "marker": marker}, sequence="account:42")
    run_jobs()
    page = admin_client.get(f"/admin/django_jobqueue/job/{after.pk}/change/").content.decode()
    assert "account:42" in page and "blocked: retry or cancel its head" in page
    assert f"/django_jobqueue/job/{head.pk}/change/" in page
    page = admin_client.get(f"/admin/django_jobqueue/job/{head.pk}/change/").content.decode()
    assert "Cancel (skip it)" in page and f"/django_jobqueue/job/{after.pk}/change/" in page


def test_a_django_task_joins_a_sequence_through_using():
    pytest.importorskip("django.tasks")
    from tests.testapp.tasks import add

    first = add.using(sequence="tasks:1").enqueue(1, 2)
    second = add.using(sequence="tasks:1", sequence_on_failure="block").enqueue(3, 4)
    rows = Job.objects.filter(sequence="tasks:1").order_by("pk")
    assert [(j.state, j.sequence_blocks) for j in rows] == [("ready", False), ("waiting", True)]
    run_jobs()
    assert set(rows.values_list("state", flat=True)) == {"done"}
    assert [int(r.id) for r in (first, second)] == [j.pk for j in rows]


def test_a_schedule_takes_a_sequence():
    from django_jobqueue.schedules import parse

    entry = parse("nightly", {"handler": "test.noop", "every": 60, "sequence": "nightly"})
    assert entry.job_options(sequences_slot()).sequence == "nightly"


def sequences_slot():
    import datetime as dt

    return dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@only_sqlite("SQLite's limit of parameters")
def test_many_sequences_in_one_call_fit_an_sqlite_of_999_parameters():
    """An SQLite built with the old limit (999 parameters, before 3.32) still takes 400
    sequences in one enqueue_many(): the rows are locked, and their heads set, in chunks the
    limit allows (each sequence takes 3 parameters)."""
    import sqlite3

    connection.ensure_connection()
    raw = connection.connection
    before = raw.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    raw.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)
    connection.features.__dict__.pop("max_query_params", None)  # read again
    try:
        assert connection.features.max_query_params == 999
        jobs = jobqueue.enqueue_many(
            [{"type": "test.noop", "sequence": f"account:{n}"} for n in range(400)]
        )
        assert JobSequence.objects.count() == 400
        heads = set(JobSequence.objects.values_list("head", flat=True))
        assert heads == {job.pk for job in jobs}
    finally:
        raw.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, before)
        connection.features.__dict__.pop("max_query_params", None)
