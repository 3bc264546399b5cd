"""The admin pages: what each shows, who may see them, and how cheaply they load."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.contrib import admin
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_jobqueue.admin import (
    DeadJobAdmin,
    JobAdmin,
    LiveLeaseAdmin,
    QueueOverviewAdmin,
    WorkerAdmin,
)
from django_jobqueue.admin.graph import BOUND
from django_jobqueue.models import DeadJob, Job, JobDependency, LiveLease, QueueOverview, Worker
from tests.support import admin_support as support
from tests.support.admin_support import Scenario, every_page, url
from tests.support.factories import JobFactory

pytestmark = pytest.mark.django_db


def test_pages_are_registered() -> None:
    registry = admin.site._registry
    assert isinstance(registry[Job], JobAdmin)
    assert isinstance(registry[LiveLease], LiveLeaseAdmin)
    assert isinstance(registry[DeadJob], DeadJobAdmin)
    assert isinstance(registry[QueueOverview], QueueOverviewAdmin)
    assert isinstance(registry[Worker], WorkerAdmin)
    assert JobDependency not in registry


def test_every_page_loads_for_a_superuser(admin_client: Client, scenario: Scenario) -> None:
    for page in every_page(scenario):
        response = admin_client.get(page)
        assert response.status_code == 200, page


def test_index_links_to_overview_leases_and_dead_jobs(admin_client: Client) -> None:
    content = admin_client.get("/admin/").content.decode()
    for name in ("queueoverview", "livelease", "deadjob", "job", "worker"):
        assert url(f"{name}_changelist") in content


def test_job_list_shows_error_line_run_time_and_newest_first(
    admin_client: Client, scenario: Scenario
) -> None:
    content = admin_client.get(url("job_changelist")).content.decode()
    assert "RuntimeError: upstream API returned 502" in content
    assert "second line" not in content  # first line only
    # The running job's run time: it started 1m 15s before the scenario was written, which a
    # loaded machine may have done seconds before this page.
    ran_for = (timezone.now() - scenario.running.started_at).total_seconds()
    shown = [f"{s // 60}m {s % 60:02d}s" for s in range(75, int(ran_for) + 1)]
    assert any(text in content for text in shown), shown
    ids = [int(pk) for pk in re.findall(r'name="_selected_action" value="(\d+)"', content)]
    assert ids == sorted(ids, reverse=True) and len(ids) == len(scenario.jobs())


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("state=dead", ["dead", "container", "child_dead"]),
        ("queue=emails", ["ready"]),
        ("group=acme", ["ready"]),
        ("type=emails.send", ["ready"]),
        ("has_error=yes", ["dead", "child_dead", "downstream"]),
        # A workflow's "see them" link: its dead and cancelled children, failed once or not.
        ("container={container}&state=failed", ["child_dead", "downstream"]),
        ("q=emails.send", ["ready"]),
        ("q=fetch-7", ["dead"]),
        ("container={container}", ["child_done", "child_dead", "downstream"]),
        ("upstream_of={downstream}", ["child_dead"]),
        ("downstream_of={child_dead}", ["downstream"]),
        ("worker=web-1:4242:a1b2", ["running"]),
    ],
)
def test_job_list_filters_and_search(
    admin_client: Client, scenario: Scenario, query: str, expected: list[str]
) -> None:
    query = query.format(
        **{
            name: getattr(scenario, name).pk
            for name in [*expected, "container", "downstream", "child_dead"]
        }
    )
    response = admin_client.get(url("job_changelist") + "?" + query)
    assert response.status_code == 200
    shown = {job.pk for job in response.context["cl"].result_list}
    assert shown == {getattr(scenario, name).pk for name in expected}


def test_search_by_id(admin_client: Client, scenario: Scenario) -> None:
    response = admin_client.get(url("job_changelist"), {"q": str(scenario.done.pk)})
    assert [job.pk for job in response.context["cl"].result_list] == [scenario.done.pk]


def test_lists_never_count_the_table_nor_select_distinct(
    admin_client: Client, scenario: Scenario
) -> None:
    JobFactory.create_batch(120)
    assert "_facets" not in admin_client.get(url("job_changelist")).content.decode()
    for page in (
        url("job_changelist"),
        url("livelease_changelist"),
        url("deadjob_changelist"),
        url("job_changelist") + "?state=ready&queue=default&p=2",
    ):
        with CaptureQueriesContext(connection) as queries:
            assert admin_client.get(page).status_code == 200
        for query in queries.captured_queries:
            sql = query["sql"].upper()
            assert "DISTINCT" not in sql, sql
            if "COUNT(" in sql:
                assert "LIMIT" in sql, sql  # bounded: a few pages ahead at most
            if "DJANGO_JOBQUEUE_JOB" in sql and "LIMIT" not in sql and "COUNT(" not in sql:
                assert "WHERE" in sql, sql


def test_job_list_defers_the_json_columns(admin_client: Client, scenario: Scenario) -> None:
    with CaptureQueriesContext(connection) as queries:
        admin_client.get(url("job_changelist"))
    listing = [q["sql"] for q in queries.captured_queries if "ORDER BY" in q["sql"]]
    assert listing
    for sql in listing:
        assert '"args"' not in sql and "`args`" not in sql
        assert '"result"' not in sql and "`result`" not in sql


def test_a_long_list_pages_without_counting_it_all(admin_client: Client) -> None:
    JobFactory.create_batch(400)
    response = admin_client.get(url("job_changelist"))
    cl = response.context["cl"]
    assert cl.paginator.capped and cl.result_count == 300  # six pages of 50 counted
    assert "300+ jobs" in response.content.decode()
    last = admin_client.get(url("job_changelist") + "?p=8")
    assert last.status_code == 200 and len(last.context["cl"].result_list) == 50


def test_dead_job_page(admin_client: Client, scenario: Scenario) -> None:
    content = admin_client.get(url("job_change", scenario.dead.pk)).content.decode()
    assert content.count('class="jq-traceback"') == 4  # each attempt's, and the last one
    assert "&lt;b&gt;escaped&lt;/b&gt;" in content and "<b>escaped</b>" not in content
    assert "&quot;account_id&quot;: 7" in content  # pretty-printed JSON
    assert "3 of 3" in content
    assert 'name="_save"' not in content


def test_running_job_page_shows_its_lease(admin_client: Client, scenario: Scenario) -> None:
    content = admin_client.get(url("job_change", scenario.running.pk)).content.decode()
    assert url("worker_change", scenario.live_worker.pk) in content
    assert "host web-1, pid 4242" in content
    assert "EXPIRED" not in content
    stuck = admin_client.get(url("job_change", scenario.stuck.pk)).content.decode()
    assert "EXPIRED" in stuck


def test_workflow_page_links_container_children_upstream_and_cause(
    admin_client: Client, scenario: Scenario
) -> None:
    page = admin_client.get(url("job_change", scenario.downstream.pk)).content.decode()
    assert "cancelled because job" in page
    assert url("job_change", scenario.child_dead.pk) in page  # upstream and its cause
    assert url("job_change", scenario.container.pk) in page
    assert "<svg" in page and 'class="jq-graph"' in page
    box = admin_client.get(url("job_change", scenario.container.pk)).content.decode()
    for child in (scenario.child_done, scenario.child_dead, scenario.downstream):
        assert url("job_change", child.pk) in box


def test_workflow_picture_collapses_large_neighbourhoods(admin_client: Client) -> None:
    root = JobFactory(has_dependents=True)
    for _ in range(BOUND + 4):
        JobDependency.objects.create(job=JobFactory(state=Job.State.WAITING), depends_on=root)
    content = admin_client.get(url("job_change", root.pk)).content.decode()
    start = content.index('<svg class="jq-graph"')
    svg = content[start : content.index("</svg>", start)]
    assert "+4 more" in svg
    assert f"downstream_of={root.pk}" in svg
    assert "http" not in svg.replace("http://www.w3.org/2000/svg", "")  # nothing from outside


def test_operator_cancel_is_named(admin_client: Client) -> None:
    job = JobFactory(state=Job.State.CANCELLED, cancel_requested=True, finished_at=timezone.now())
    content = admin_client.get(url("job_change", job.pk)).content.decode()
    assert "cancelled by an operator" in content


def test_live_leases_page(admin_client: Client, scenario: Scenario) -> None:
    response = admin_client.get(url("livelease_changelist"))
    content = response.content.decode()
    assert {j.pk for j in response.context["cl"].result_list} == {
        scenario.running.pk,
        scenario.stuck.pk,
    }
    assert "web-1 pid 4242" in content
    assert "(stale)" in content and "EXPIRED" in content and "(late)" in content
    assert 'name="extra_attempts"' not in content  # no retry on this page


def test_dead_jobs_page(admin_client: Client, scenario: Scenario) -> None:
    response = admin_client.get(url("deadjob_changelist"))
    shown = {j.pk for j in response.context["cl"].result_list}
    assert shown == {
        scenario.dead.pk,
        scenario.container.pk,
        scenario.child_dead.pk,
        scenario.downstream.pk,
    }
    content = response.content.decode()
    assert "cancelled because job" in content
    assert "RuntimeError: upstream API returned 502" in content
    # Its rows open the job's own page.
    proxy = admin_client.get(url("deadjob_change", scenario.dead.pk))
    assert proxy.status_code == 302 and proxy["Location"] == url("job_change", scenario.dead.pk)


def test_workers_page(admin_client: Client, scenario: Scenario) -> None:
    content = admin_client.get(url("worker_changelist")).content.decode()
    assert url("job_change", scenario.running.pk) in content
    assert "STALE" in content and "alive" in content
    assert url("livelease_changelist") + "?worker=web-1%3A4242%3Aa1b2" in content


def test_overview_page(admin_client: Client, scenario: Scenario) -> None:
    response = admin_client.get(url("queueoverview_changelist"))
    stats = response.context["stats"]
    rows = {
        row["queue"]: dict(zip(stats["states"], row["counts"], strict=True))
        for row in stats["rows"]
    }
    assert rows["emails"]["ready"] == 1 and rows["default"]["running"] == 2
    assert stats["dead_last_hour"] == "3"  # dead, container, child_dead
    assert stats["oldest_ready"] is not None
    assert stats["expired_leases"] == 1
    assert (stats["workers_alive"], stats["workers_stale"]) == (1, 1)
    assert "Dead in the last hour" in response.content.decode()


def test_overview_names_ready_jobs_no_live_worker_handles(admin_client: Client) -> None:
    """A task no worker imports waits in ready (rolling deploys): the overview says so."""
    Worker.objects.create(
        id="w-live",
        host="h",
        pid=1,
        concurrency=1,
        started_at=timezone.now(),
        heartbeat_at=timezone.now(),
        expires_at=timezone.now() + dt.timedelta(hours=1),
        handlers=["test.noop"],
    )
    JobFactory(type="test.noop", state="ready")
    JobFactory(type="task:default:gone.func", state="ready")
    JobFactory(type="task:default:gone.func", state="ready")
    response = admin_client.get(url("queueoverview_changelist"))
    stats = response.context["stats"]
    assert [(r["type"], r["count"]) for r in stats["unhandled"]] == [("task:default:gone.func", 2)]
    content = response.content.decode()
    assert "Waiting for a handler" in content
    assert "2 ready or scheduled job(s) of types no live worker has" in content, content
    listed = admin_client.get(stats["unhandled"][0]["url"])
    assert listed.status_code == 200
    assert {job.type for job in listed.context["cl"].result_list} == {"task:default:gone.func"}


def test_overview_lists_no_waiting_types_when_every_type_is_handled(admin_client: Client) -> None:
    JobFactory(type="test.noop", state="ready")
    response = admin_client.get(url("queueoverview_changelist"))
    assert response.context["stats"]["unhandled"] == []
    assert "Waiting for a handler" not in response.content.decode()


# -- who may see what -----------------------------------------------------------------------


def test_anonymous_users_are_sent_to_login(client: Client, scenario: Scenario) -> None:
    for page in every_page(scenario):
        response = client.get(page)
        assert response.status_code == 302 and "/login/" in response["Location"], page


def test_staff_without_permission_sees_nothing(scenario: Scenario) -> None:
    client = support.login(support.make_user("nobody"))
    for page in every_page(scenario):
        assert client.get(page).status_code == 403, page
    assert "django_jobqueue" not in client.get("/admin/").content.decode()


def test_view_only_staff_sees_pages_but_no_actions(scenario: Scenario) -> None:
    client = support.login(support.make_user("viewer", "view_job", "view_worker"))
    for page in every_page(scenario):
        assert client.get(page).status_code == 200, page
    for name in ("job", "livelease", "deadjob"):
        content = client.get(url(f"{name}_changelist")).content.decode()
        assert 'name="action"' not in content and "_selected_action" not in content


def test_nobody_adds_edits_or_deletes_through_forms(
    admin_client: Client, scenario: Scenario
) -> None:
    job = scenario.ready
    assert admin_client.get(url("job_add")).status_code == 403
    assert (
        admin_client.post(url("job_change", job.pk), {"type": "x", "state": "dead"}).status_code
        == 403
    )
    assert admin_client.post(url("job_delete", job.pk), {"post": "yes"}).status_code == 403
    assert (
        admin_client.post(
            url("worker_delete", scenario.live_worker.pk), {"post": "yes"}
        ).status_code
        == 403
    )
    job.refresh_from_db()
    assert (job.type, job.state) == ("emails.send", "ready")
    content = admin_client.get(url("job_changelist")).content.decode()
    assert "delete_selected" not in content and url("job_add") not in content
