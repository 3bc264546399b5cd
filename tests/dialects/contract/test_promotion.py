"""The dialect contract: promotion of due and freed jobs."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from django_jobqueue.engine.staging import promote_due
from django_jobqueue.models import Job
from tests.support.factories import JobDependencyFactory, JobFactory

# Claims and finishes commit (and one test uses a second connection): no wrapping transaction.
pytestmark = pytest.mark.django_db(transaction=True)


def test_promote_makes_only_due_scheduled_jobs_ready(dialect):
    """Due scheduled jobs become ready, earliest first and at most `batch`; the rest wait."""
    now = dialect.now()
    due = [
        JobFactory(state=Job.State.SCHEDULED, run_after=now - dt.timedelta(seconds=s))
        for s in (1, 3, 2)
    ]
    future = JobFactory(state=Job.State.SCHEDULED, run_after=now + dt.timedelta(hours=1))
    waiting = JobFactory(state=Job.State.WAITING, run_after=now - dt.timedelta(hours=1))
    assert promote_due(dialect, batch=2) == 2
    states = dict(Job.objects.values_list("pk", "state"))
    assert states[due[1].pk] == states[due[2].pk] == Job.State.READY  # the two earliest
    assert states[due[0].pk] == Job.State.SCHEDULED
    assert promote_due(dialect, batch=2) == 1
    assert promote_due(dialect, batch=2) == 0
    states = dict(Job.objects.values_list("pk", "state"))
    assert states[due[0].pk] == Job.State.READY
    assert states[future.pk] == Job.State.SCHEDULED
    assert states[waiting.pk] == Job.State.WAITING


def test_a_promotion_wakes_the_workers_of_its_queues_here_and_elsewhere(dialect, monkeypatch):
    """A promotion tells this process's idle workers (wake.notify) of each queue it made ready
    and, where the database can push (PostgreSQL's NOTIFY, sent by the promoting statement
    itself), the workers of every other process; a promotion of nothing tells no one."""
    from django.db import connections

    from django_jobqueue.engine import wake

    woken: list[str] = []
    monkeypatch.setattr(wake, "notify", lambda using, queue: woken.append(queue))
    now = dialect.now()
    for queue in ("mail", "mail", "reports"):
        JobFactory(state=Job.State.SCHEDULED, queue=queue, run_after=now - dt.timedelta(seconds=1))
    listener = connections.create_connection("default")  # another session: another process
    try:
        listener.set_autocommit(True)
        pushes = dialect.supports_listen_notify
        if pushes:
            with listener.cursor() as cursor:
                cursor.execute("LISTEN django_jobqueue")
        assert promote_due(dialect, batch=10) == 3
        assert sorted(woken) == ["mail", "reports"]
        if pushes:
            received = list(listener.connection.notifies(timeout=10, stop_after=2))
            assert sorted(n.payload for n in received) == ["mail", "reports"]
        woken.clear()
        assert promote_due(dialect, batch=10) == 0
        assert woken == []
    finally:
        listener.close()


def test_promote_frees_only_waiting_jobs_whose_upstreams_are_all_done(dialect):
    """Dialect.promote(): a waiting job whose upstreams are done becomes ready, or scheduled
    when its run_after lies ahead; one with an unfinished upstream keeps waiting."""
    now = dialect.now()
    done = JobFactory(state=Job.State.DONE, finished_at=now)
    running = JobFactory(state=Job.State.RUNNING, lease_owner="w0", lease_expires=now)

    def waiting(queue: str, *upstreams: Job, **fields: Any) -> Job:
        job = JobFactory(state=Job.State.WAITING, queue=queue, **fields)
        for upstream in upstreams:
            JobDependencyFactory(job=job, depends_on=upstream)
        return job

    free = waiting("free", done)
    later = waiting("later", done, run_after=now + dt.timedelta(hours=1))
    blocked = waiting("blocked", done, running)
    elsewhere = JobFactory(state=Job.State.READY, queue="elsewhere")
    ids = [free.pk, later.pk, blocked.pk, elsewhere.pk]
    queues = dialect.run_in_transaction(lambda: dialect.promote(ids))
    assert queues == {"free", "later"}
    states = dict(Job.objects.values_list("pk", "state"))
    assert states[free.pk] == Job.State.READY
    assert states[later.pk] == Job.State.SCHEDULED
    assert states[blocked.pk] == Job.State.WAITING
    assert states[elsewhere.pk] == Job.State.READY
    assert dialect.run_in_transaction(lambda: dialect.promote([blocked.pk])) == set()
