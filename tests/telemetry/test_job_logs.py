"""Job log lines (ctx.logger), through `testing.run_jobs()` (the worker's own claim, run and
record functions, in this thread): kept by attempt, capped, pruned with the job, shown on the
job page. With real worker processes: tests/telemetry/test_job_logs_workers.py."""

from __future__ import annotations

import datetime as dt
import logging
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import Client

import django_jobqueue as jobqueue
from django_jobqueue import conf
from django_jobqueue.engine import joblogs
from django_jobqueue.models import Job, JobLogLine
from django_jobqueue.testing import run_jobs
from tests.support.markers import requires_tasks

pytestmark = pytest.mark.django_db


def kept(job: Job) -> list[tuple[int, str, str]]:
    """(attempt, level name, message) of the job's kept lines, in the order they were logged."""
    rows = JobLogLine.objects.filter(job_id=job.pk).order_by("pk")
    return [(row.attempt, row.level_name, row.message) for row in rows]


@pytest.fixture
def job_logs(settings):
    """Set JOBQUEUE's JOB_LOG_* settings for this test."""

    def set_to(**values: object) -> None:
        settings.JOBQUEUE = {**settings.JOBQUEUE, **{f"JOB_LOG_{k}": v for k, v in values.items()}}

    return set_to


def test_each_attempt_keeps_its_own_lines_from_info_up():
    job = jobqueue.enqueue("logs.retried", {"fail_until": 1}, max_attempts=2)
    run_jobs()
    job.refresh_from_db()
    assert job.state == Job.State.DONE
    lines = kept(job)
    first = [line for line in lines if line[0] == 1]
    assert [(a, level) for a, level, _ in first] == [(1, "INFO"), (1, "WARNING"), (1, "ERROR")]
    assert first[0][2] == f"starting attempt 1 of job {job.pk}"
    assert first[2][2].startswith("attempt 1 failed\nTraceback (most recent call last):")
    assert first[2][2].endswith("ValueError: boom on attempt 1")
    assert [line for line in lines if line[0] == 2] == [
        (2, "INFO", f"starting attempt 2 of job {job.pk}"),
        (2, "WARNING", "markup: <script>alert('x')</script> & more"),
        (2, "INFO", "done on attempt 2"),
    ]
    assert not [line for line in lines if "debug" in line[2]]  # below JOB_LOG_LEVEL


def test_the_lines_reach_the_projects_logging_with_the_job_as_extra(caplog):
    job = jobqueue.enqueue("logs.retried")
    with caplog.at_level(logging.INFO, logger="django_jobqueue.job"):
        run_jobs()
    [record] = [r for r in caplog.records if r.getMessage().startswith("starting attempt")]
    assert record.name == "django_jobqueue.job"
    assert (record.job_id, record.job_type, record.attempt) == (job.pk, "logs.retried", 1)  # type: ignore[attr-defined]
    assert record.funcName == "retried"  # the handler's line, not the adapter's


def test_the_kept_lines_do_not_depend_on_the_logging_configuration(caplog):
    """The project's logging shows WARNING and up only: INFO lines are kept all the same."""
    job = jobqueue.enqueue("logs.retried")
    logger = logging.getLogger("django_jobqueue.job")
    old = logger.level
    logger.setLevel(logging.WARNING)
    try:
        run_jobs()
    finally:
        logger.setLevel(old)
    assert [level for _, level, _ in kept(job)] == ["INFO", "WARNING", "INFO"]


def test_a_lower_or_higher_level_keeps_what_it_says(job_logs):
    job_logs(LEVEL="WARNING")
    job = jobqueue.enqueue("logs.retried")
    run_jobs()
    assert [level for _, level, _ in kept(job)] == ["WARNING"]
    job_logs(LEVEL=logging.DEBUG)
    job = jobqueue.enqueue("logs.retried")
    run_jobs()
    assert [level for _, level, _ in kept(job)] == ["DEBUG", "INFO", "WARNING", "INFO"]


def test_an_attempt_keeps_at_most_the_cap_then_says_how_many_it_dropped(job_logs):
    job_logs(MAX_LINES=5, MAX_LINE_LENGTH=40)
    job = jobqueue.enqueue("logs.flood", {"count": 12, "long": 100})
    run_jobs()
    lines = kept(job)
    assert [message for _, _, message in lines[:5]] == [f"line {n}" for n in range(5)]
    assert lines[5] == (
        1,
        "WARNING",
        "8 lines dropped: an attempt keeps 5 (JOBQUEUE['JOB_LOG_MAX_LINES'])",
    )
    assert len(lines) == 6


def test_a_long_line_is_cut_to_the_length_setting(job_logs):
    job_logs(MAX_LINE_LENGTH=40)
    job = jobqueue.enqueue("logs.flood", {"count": 0, "long": 100})
    run_jobs()
    [(_, _, message)] = kept(job)
    assert message == "x" * 39 + "…"


def test_no_line_is_kept_when_the_cap_is_zero(job_logs):
    job_logs(MAX_LINES=0)
    job = jobqueue.enqueue("logs.flood", {"count": 3})
    run_jobs()
    assert kept(job) == []


def test_a_resumed_run_adds_to_its_attempts_lines_within_the_same_cap(job_logs):
    """The run after a wait is the same attempt (and logs again what the handler logs before
    the wait, as it runs from the top): its lines join the first run's, and the cap counts
    both runs' lines."""
    job_logs(MAX_LINES=4)
    job = jobqueue.enqueue("logs.waits", {"key": "log-resume", "count": 3})
    run_jobs()
    assert Job.objects.get(pk=job.pk).state == Job.State.WAITING
    jobqueue.send_event("log-resume")
    run_jobs()
    assert Job.objects.get(pk=job.pk).state == Job.State.DONE
    assert kept(job) == [
        (1, "INFO", "before 0"),
        (1, "INFO", "before 1"),
        (1, "INFO", "before 2"),
        (1, "INFO", "before 0"),
        (1, "WARNING", "5 lines dropped: an attempt keeps 4 (JOBQUEUE['JOB_LOG_MAX_LINES'])"),
    ]


def test_lines_no_database_takes_as_they_are_are_stored_escaped():
    job = jobqueue.enqueue("logs.odd")
    run_jobs()
    assert [message for _, _, message in kept(job)] == [
        "nul:\\x00:end",
        "emoji: \N{SNAKE}",
    ]


def test_a_lone_surrogate_is_kept_escaped():
    assert joblogs._message("surrogate:\ud800:end", (), None, 100) == "surrogate:\\ud800:end"


def test_a_line_whose_arguments_do_not_fit_is_kept_as_it_was_given():
    """(The project's logging reports such a record as its handlers do: pytest's raises.)"""
    assert joblogs._message("too few %s %s", ("args",), None, 100) == (
        "'too few %s %s' (arguments that do not fit it: ('args',))"
    )


@requires_tasks
def test_a_django_task_keeps_what_it_logs_through_its_context():
    from tests.testapp import tasks

    result = tasks.logged.enqueue("nightly")
    run_jobs()
    assert kept(Job.objects.get(pk=result.id)) == [(1, "INFO", "task nightly, attempt 1")]


def test_only_ctx_logger_lines_are_kept():
    job = jobqueue.enqueue("logs.plain_logging")
    run_jobs()
    assert kept(job) == [(1, "WARNING", "through ctx.logger")]


@pytest.mark.django_db(transaction=True)
def test_lines_that_cannot_be_stored_are_logged_and_fail_nothing(caplog):
    """The handler deletes its own job: its lines have no job to belong to."""
    jobqueue.enqueue("logs.self_deleting")
    with caplog.at_level(logging.WARNING, logger="django_jobqueue.joblogs"):
        run_jobs()
    assert "Could not store the log lines of job(s) id=" in caplog.text
    assert not JobLogLine.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_prune_deletes_a_jobs_lines_with_it():
    gone = jobqueue.enqueue("logs.retried")
    stays = jobqueue.enqueue("logs.retried", {"fail_until": 1}, max_attempts=1)
    run_jobs()
    assert {row.job_id for row in JobLogLine.objects.all()} == {gone.pk, stays.pk}
    old = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    Job.objects.filter(pk__in=[gone.pk, stays.pk]).update(finished_at=old)
    call_command("jobqueue_prune", "--older-than", "1d", stdout=StringIO())  # done only
    assert not Job.objects.filter(pk=gone.pk).exists()
    assert {row.job_id for row in JobLogLine.objects.all()} == {stays.pk}


def test_the_job_page_shows_the_lines_by_attempt_escaped(admin_client: Client):
    job = jobqueue.enqueue("logs.retried", {"fail_until": 1}, max_attempts=2)
    run_jobs()
    page = admin_client.get(f"/admin/django_jobqueue/job/{job.pk}/change/").content.decode()
    section = page[page.index('id="jq-log"') :]
    assert section.index("attempt 2 &middot; 3 lines") < section.index("attempt 1 &middot; 3")
    assert '<details class="jq-log-attempt" open><summary>attempt 2' in section
    assert "markup: &lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; more" in section
    assert "<script>alert" not in page
    assert "ValueError: boom on attempt 1" in section


def test_the_job_page_says_where_lines_come_from_when_there_are_none(admin_client: Client):
    job = jobqueue.enqueue("test.noop")
    page = admin_client.get(f"/admin/django_jobqueue/job/{job.pk}/change/").content.decode()
    assert "ctx.logger</code> (INFO and above) is kept here" in page


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("JOB_LOG_LEVEL", "LOUD", "must be a logging level"),
        ("JOB_LOG_LEVEL", -1, "must be a logging level"),
        ("JOB_LOG_MAX_LINES", -1, "from 0 (keep none)"),
        ("JOB_LOG_MAX_LINES", True, "from 0 (keep none)"),
        ("JOB_LOG_MAX_LINE_LENGTH", 5, "from 10 to 1,000,000"),
    ],
)
def test_bad_job_log_settings_are_refused(key, value, message):
    with pytest.raises(Exception, match=message.replace("(", r"\(").replace(")", r"\)")):
        conf.load({key: value})
