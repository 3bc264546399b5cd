"""The admin's Limits page: occupancy, and the actions of jobqueue_limits, permission-checked."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

import django_jobqueue as jobqueue
from django_jobqueue.dialects import get_dialect
from django_jobqueue.limits import resources as quotas
from django_jobqueue.models import Limit, LimitSetting
from tests.support.admin_support import csrf_token, login, make_user, url

pytestmark = pytest.mark.django_db

LIMITS = {"api": {"concurrency": 2}, "tenant:*": {"concurrency": 1, "rate": "10/m"}}


@pytest.fixture(autouse=True)
def limits(settings: Any) -> None:
    settings.JOBQUEUE = {**settings.JOBQUEUE, "LIMITS": LIMITS}


def test_the_page_shows_each_resource_and_what_waits_for_it(admin_client: Client) -> None:
    for _ in range(3):
        jobqueue.enqueue("limits.work", uses={"tenant:42": 1})
    Limit.objects.create(name="tenant:42")
    quotas.close(get_dialect("default"), "api", 60)
    html = admin_client.get(url("limit_changelist")).content.decode()
    assert "tenant:42" in html and "tenant:*" in html and "10/m" in html
    assert "Reopen" in html  # api is closed
    assert "<td>3</td>" in html  # three jobs wait for tenant:42


def test_an_operator_changes_resets_and_reopens(admin_client: Client) -> None:
    page = url("limit_changelist")
    admin_client.post(page, {"action": "set", "name": "tenant:*", "concurrency": "4"})
    assert LimitSetting.objects.get(name="tenant:*").concurrency == 4
    response = admin_client.get(page)
    assert "(changed)" in response.content.decode()
    admin_client.post(page, {"action": "reset", "name": "tenant:*"})
    assert not LimitSetting.objects.exists()
    quotas.close(get_dialect("default"), "api", 60)
    admin_client.post(page, {"action": "reopen", "name": "api"})
    assert Limit.objects.get(name="api").closed_until is None


@pytest.mark.parametrize(
    "data",
    [
        {"action": "set", "name": "nope", "concurrency": "1"},
        {"action": "set", "name": "api", "rate": "5/w"},
        {"action": "set", "name": "api"},
        {"action": "explode", "name": "api"},
        {"action": "reset", "name": "nope"},
    ],
)
def test_bad_changes_are_refused_with_a_message(admin_client: Client, data: dict) -> None:
    response = admin_client.post(url("limit_changelist"), data, follow=True)
    assert response.status_code == 200
    assert "Nothing was changed" in response.content.decode()
    assert not LimitSetting.objects.exists()


def test_the_page_and_its_actions_are_permission_checked() -> None:
    page = url("limit_changelist")
    nobody = login(make_user("jobs-only", "view_job"))
    assert nobody.get(page).status_code == 403
    viewer = login(make_user("viewer", "view_limit"))
    html = viewer.get(page).content.decode()
    assert "tenant:*" in html and "Change a limit" not in html
    assert (
        viewer.post(page, {"action": "set", "name": "api", "concurrency": "5"}).status_code == 403
    )
    assert not LimitSetting.objects.exists()
    changer = login(make_user("changer", "view_limit", "change_limit"), enforce_csrf_checks=True)
    token = csrf_token(changer, page)
    changer.post(page, {"action": "set", "name": "api", "concurrency": "5",
                        "csrfmiddlewaretoken": token})  # fmt: skip
    assert LimitSetting.objects.get(name="api").concurrency == 5
    assert changer.post(page, {"action": "reset", "name": "api"}).status_code == 403  # no CSRF


def test_queues_are_paused_and_resumed_from_the_page(admin_client: Client) -> None:
    from django_jobqueue import pausing

    jobqueue.enqueue("limits.work", queue="exports")
    page = url("limit_changelist")
    html = admin_client.get(page).content.decode()
    assert "exports" in html and "Pause" in html
    admin_client.post(page, {"action": "pause", "name": "exports"})
    assert pausing.paused_queues() == ("exports",)
    overview = admin_client.get(url("queueoverview_changelist")).content.decode()
    assert "exports" in overview.split('id="jq-paused"')[1].split("</tr>")[0]
    admin_client.post(page, {"action": "resume", "name": "exports"})
    assert pausing.paused_queues() == ()
    response = admin_client.post(page, {"action": "pause", "name": "bad\x1bname"}, follow=True)
    assert "Nothing was changed" in response.content.decode()
    viewer = login(make_user("queue-viewer", "view_limit"))
    assert viewer.post(page, {"action": "pause", "name": "exports"}).status_code == 403
    assert pausing.paused_queues() == ()
