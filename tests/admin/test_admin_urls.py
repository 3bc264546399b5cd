"""What the admin accepts from a URL: its own filters only, and never a 500 on a crafted value."""

from __future__ import annotations

import pytest
from django.test import Client

from django_jobqueue.admin import graph
from django_jobqueue.models import Job
from tests.support import admin_support as support
from tests.support.admin_support import Scenario, url

pytestmark = pytest.mark.django_db

HUGE = "9" * 30


@pytest.fixture
def viewer() -> Client:
    """Staff with view permissions only: the user the lookups must not empower."""
    return support.login(support.make_user("viewer", "view_job", "view_worker"))


@pytest.mark.parametrize(
    ("page", "query"),
    [
        ("job_changelist", "args__regex=(a%2B)%2Bb"),
        ("job_changelist", "last_error__icontains=x"),
        ("job_changelist", "type__startswith=reports"),
        ("job_changelist", "queue__exact=default"),  # a real column, not a filter of the page
        ("job_changelist", "lease_owner=web-1:4242:a1b2"),
        ("job_changelist", "parent__type=workflow.nightly"),
        ("livelease_changelist", "args__regex=a"),
        ("livelease_changelist", "state=running"),  # a filter of another page
        ("deadjob_changelist", "last_error__icontains=x"),
        ("worker_changelist", "host__regex=web"),
        ("worker_changelist", "job_ids__contains=1"),
    ],
)
def test_a_lookup_the_page_does_not_offer_is_refused(
    viewer: Client, scenario: Scenario, page: str, query: str
) -> None:
    """Django's refusal of a disallowed lookup (DisallowedModelAdminLookup) is a 400."""
    response = viewer.get(url(page) + "?" + query)
    assert response.status_code == 400


@pytest.mark.parametrize(
    ("page", "query", "expected"),
    [
        ("job_changelist", "state=dead", ["dead", "container", "child_dead"]),
        ("job_changelist", "queue=emails", ["ready"]),
        ("job_changelist", "group=acme", ["ready"]),
        ("job_changelist", "type=emails.send", ["ready"]),
        ("job_changelist", "has_error=yes", ["dead", "child_dead", "downstream"]),
        ("job_changelist", "container={container}", ["child_done", "child_dead", "downstream"]),
        ("job_changelist", "upstream_of={downstream}", ["child_dead"]),
        ("job_changelist", "downstream_of={child_dead}", ["downstream"]),
        ("job_changelist", "worker={live_worker}", ["running"]),
        ("job_changelist", "q={done}", ["done"]),
        ("job_changelist", "q=fetch-7", ["dead"]),
        ("livelease_changelist", "worker={stale_worker}", ["stuck"]),
        ("livelease_changelist", "queue=default&type=reports.build", ["running", "stuck"]),
        ("deadjob_changelist", "state=cancelled", ["downstream"]),
        ("deadjob_changelist", "queue=default&type=reports.fetch", ["dead", "child_dead"]),
    ],
)
def test_the_pages_own_filters_links_and_search_still_work(
    viewer: Client, scenario: Scenario, page: str, query: str, expected: list[str]
) -> None:
    names = ["container", "downstream", "child_dead", "done", "live_worker", "stale_worker"]
    query = query.format(**{name: getattr(scenario, name).pk for name in names})
    response = viewer.get(url(page) + "?" + query)
    assert response.status_code == 200
    shown = {job.pk for job in response.context["cl"].result_list}
    assert shown == {getattr(scenario, name).pk for name in expected}


def test_the_links_the_admin_draws_are_allowed(viewer: Client, scenario: Scenario) -> None:
    """Every changelist link on the overview, the workers page and a workflow job's page."""
    pages = [
        url("queueoverview_changelist"),
        url("worker_changelist"),
        url("job_change", scenario.container.pk),
        url("job_change", scenario.downstream.pk),
        url("job_change", scenario.child_dead.pk),
    ]
    links = set()
    for page in pages:
        html = viewer.get(page).content.decode()
        links.update(
            link.replace("&amp;", "&")
            for link in support.hrefs(html)
            if "/django_jobqueue/" in link and "/?" in link
        )
    assert len(links) >= 5, links  # state and queue links, a worker's leases
    # The "all N jobs" links of long relation lists (graph.changelist builds them all).
    box, child = scenario.container.pk, scenario.child_dead.pk
    links.update(
        graph.changelist(**{name: pk})
        for name, pk in (("container", box), ("upstream_of", child), ("downstream_of", child))
    )
    for link in sorted(links):
        assert viewer.get(link).status_code == 200, link


@pytest.mark.parametrize(
    "path",
    [
        "job_changelist?container=²",
        "job_changelist?upstream_of=²",
        "job_changelist?downstream_of=٣",
        f"job_changelist?container={HUGE}",
        "job_changelist?q=²",
        "job_changelist?q=%23²",
        f"job_changelist?q={HUGE}",
        f"job_changelist?p={HUGE}",
        "job_changelist?p=²",
        "job_changelist?p=-3",
        "job_changelist?queue=a%00b",
        "job_changelist?group=a%00b",
        "job_changelist?type=a%00b",
        "job_changelist?state=a%00b",
        "job_changelist?worker=a%00b",
        "job_changelist?q=a%00b",
        "job_changelist?o=²",
        "livelease_changelist?worker=a%00b",
        f"livelease_changelist?p={HUGE}",
        "deadjob_changelist?queue=a%00b",
        f"worker_changelist?p={HUGE}",
        f"job_change:{HUGE}",
        "job_change:²",
        "job_history:²",
        f"job_history:{HUGE}",
        "worker_change:a%00b",
    ],
)
def test_a_crafted_url_gets_a_page_never_a_500(admin_client: Client, path: str) -> None:
    if ":" in path:
        name, object_id = path.split(":")
        address = url(name, "0").replace("/0/", f"/{object_id}/")
    else:
        name, query = path.split("?")
        address = url(name) + "?" + query
    response = admin_client.get(address, follow=True)
    assert response.status_code in (200, 400), response.status_code


@pytest.mark.parametrize("forged", ["abc", "²", "٣", HUGE, "-1", "1.5", "", "0x1"])
@pytest.mark.parametrize("page", ["job_changelist", "livelease_changelist", "deadjob_changelist"])
def test_a_forged_selection_is_ignored(
    admin_client: Client, scenario: Scenario, page: str, forged: str
) -> None:
    for action in ("cancel_jobs", "release_leases", "retry_jobs", "delete_finished_jobs"):
        data = {"action": action, "index": "0", "_selected_action": [forged]}
        response = admin_client.post(url(page), data, follow=True)
        assert response.status_code == 200, action
        data["_job_page"] = "1"
        assert admin_client.post(url(page), data, follow=True).status_code == 200, action
    assert [job.state for job in Job.objects.order_by("pk")] == [
        job.state for job in scenario.jobs()
    ]


def test_a_forged_id_beside_a_real_one_leaves_the_real_one_selected(
    admin_client: Client, scenario: Scenario
) -> None:
    data = {
        "action": "cancel_jobs",
        "index": "0",
        "_selected_action": ["²", str(scenario.ready.pk)],
    }
    response = admin_client.post(url("job_changelist"), data, follow=True)
    assert response.status_code == 200
    scenario.ready.refresh_from_db()
    assert scenario.ready.state == "cancelled"
