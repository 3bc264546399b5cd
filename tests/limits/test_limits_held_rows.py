"""A limit's lock row held by another transaction (a stalled claim, an operator's session, a
slow closure after a 429) holds back only the jobs that limit governs: a claim never waits
for it, every other job starts, and the held jobs start once the row is free. PostgreSQL and
MariaDB; SQLite's writers take turns on the whole database, so no row is held apart there."""

from __future__ import annotations

import json
import time

import pytest
from django.db import transaction

import django_jobqueue as jobqueue
from django_jobqueue import conf
from django_jobqueue.dialects import get_dialect
from django_jobqueue.engine import leases
from django_jobqueue.engine.fair_selection import FairShare
from django_jobqueue.models import Job, Limit
from tests.conftest import assert_clean_log, poll
from tests.support.lock_support import holding
from tests.support.markers import needs_skip_locked
from tests.support.workflow_support import FAST, limits_env

# SQLite has no row locks: its writers take turns on the whole database.
pytestmark = [
    pytest.mark.django_db(transaction=True),
    needs_skip_locked("SQLite's writers take turns on the whole database: no row is held apart"),
]

LIMITS = {"tenant:*": {"concurrency": 1}}


def work(**options) -> Job:
    return jobqueue.enqueue("wf.step", {"sleep": 0.05}, **options)


class Claims:
    """One worker's claims, its fair share kept from claim to claim."""

    def __init__(self) -> None:
        self.fair_share = FairShare(conf.get())

    def __call__(self) -> tuple[list[int], float]:
        started = time.monotonic()
        jobs = leases.claim(get_dialect("default"), owner="w", queues=[], limit=10,
                            lease_ttl=60, fair_share=self.fair_share)  # fmt: skip
        return [job.pk for job in jobs], time.monotonic() - started

    def while_held(self, rounds: int = 3) -> list[int]:
        """Claim `rounds` times (the first may read only held jobs, the next pass over them);
        no claim may wait for the held row."""
        taken = []
        for _ in range(rounds):
            got, took = self()
            assert took < 5, f"a claim waited {took:.1f}s for a row another transaction holds"
            taken += got
        return taken


@pytest.mark.parametrize("grouped", [False, True], ids=["one group", "a group per tenant"])
def test_a_resource_row_held_elsewhere_holds_back_only_its_own_jobs(settings, grouped):
    """Found by the review: with tenant A's resource row held, every tenant's jobs waited up
    to LOCK_TIMEOUT, again and again. A claim passes over A at once: B's job starts, A's jobs
    stay ready (not failed), and start once the row is free."""
    settings.JOBQUEUE = {**settings.JOBQUEUE, "LIMITS": LIMITS}
    a_jobs = [work(uses={"tenant:a": 1}, group="a" if grouped else "") for _ in range(5)]
    b_job = work(uses={"tenant:b": 1}, group="b" if grouped else "")
    Limit.objects.bulk_create([Limit(name="tenant:a"), Limit(name="tenant:b")])
    claims = Claims()
    with holding(Limit, name="tenant:a"):
        assert claims.while_held() == [b_job.pk]
        assert Job.objects.filter(pk__in=[j.pk for j in a_jobs], state="ready").count() == 5
    time.sleep(0.3)  # past the moment a held resource is left out of the claims
    got, _ = claims()
    assert len(got) == 1 and got[0] in [j.pk for j in a_jobs]


def test_a_claim_held_back_by_a_held_resource_claims_again_at_once(settings):
    """A claim that left a job behind because another transaction held its resource's row
    asks the worker to claim again at once (without that resource), not at the next poll; a
    claim that left nothing behind asks nothing."""
    settings.JOBQUEUE = {**settings.JOBQUEUE, "LIMITS": LIMITS}
    work(uses={"tenant:a": 1})
    Limit.objects.bulk_create([Limit(name="tenant:a")])
    claims = Claims()
    with holding(Limit, name="tenant:a"):
        claims()
        retry_at = claims.fair_share.retry_at()
        assert retry_at is not None and retry_at <= time.monotonic()
        claims()
        assert claims.fair_share.retry_at() is None  # the held resource left out: nothing behind


@pytest.mark.parametrize(
    ("setting", "value", "held", "options", "after"),
    [
        ("GROUP_LIMITS", {"a": 2, "b": 2}, "group:a", {"group": "a"}, 2),
        ("RATE_LIMITS", {"a": "100/s", "b": "100/s"}, "group:a", {"group": "a"}, 3),
        ("QUEUE_LIMITS", {"qa": 2, "qb": 2}, "queue:qa", {"queue": "qa"}, 2),
    ],
    ids=["group cap", "group rate", "queue cap"],
)
def test_a_cap_row_held_elsewhere_holds_back_only_what_it_caps(
    settings, setting, value, held, options, after
):
    """GROUP_LIMITS, RATE_LIMITS and QUEUE_LIMITS are resources of the same engine, a row per
    group or queue ("group:a", "queue:qa"): one held by another transaction gives its group
    (or queue) no room in the claims meanwhile, which never wait for it; the other group's job
    starts, and the held ones once it is free."""
    settings.JOBQUEUE = {**settings.JOBQUEUE, setting: value}
    held_jobs = [work(**options) for _ in range(3)]
    other = work(**{key: "b" if key == "group" else "qb" for key in options})
    claims = Claims()
    claims.fair_share.ensure_limit_rows("default")
    with holding(Limit, name=held):
        assert claims.while_held() == [other.pk]
        assert claims.fair_share.retry_at() is not None  # looks again soon, not at the poll
    got, _ = claims()
    assert len(got) == after and set(got) <= {j.pk for j in held_jobs}


def test_a_dynamic_cap_locks_its_group_alone(settings):
    """A DYNAMIC_LIMIT cap is its group's resource ("group:a"): while another transaction holds
    that row, a claim starts none of group a's jobs, does not wait, and starts group b's (the
    hook's caps once shared one row that every claim of every group locked)."""
    settings.JOBQUEUE = {**settings.JOBQUEUE, "DYNAMIC_LIMIT": lambda group: 5}
    held_job, other = work(group="a"), work(group="b")
    claims = Claims()
    claims()  # makes the groups' rows, and takes both jobs
    held_job, other = work(group="a"), work(group="b")
    with holding(Limit, name="group:a"):
        assert claims.while_held(rounds=2) == [other.pk]
    got, _ = claims()
    assert got == [held_job.pk]


# -- the same with worker processes ----------------------------------------------------------

HOLD = 20.0  # seconds the row is held, as the review held it
BOUND = 5.0  # seconds a job may take to start when nothing holds it back (a loaded machine)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["resource", "group cap"])
def test_workers_start_other_tenants_jobs_while_a_tenants_row_is_held(settings, start_worker, kind):
    """Two worker processes; another connection holds tenant A's row (its resource's, or its
    group cap's) for 20 s. Tenant B's jobs, enqueued throughout, each start within a few
    seconds; A's start only once the hold ends, and then within a few seconds."""
    if kind == "resource":
        settings.JOBQUEUE = {**settings.JOBQUEUE, "LIMITS": LIMITS}
        env = {"JOBQUEUE_TEST_LIMITS": json.dumps(LIMITS)}
        row, lookup = Limit, {"name": "tenant:a"}
        Limit.objects.bulk_create([Limit(name="tenant:a"), Limit(name="tenant:b")])

        def job(tenant: str) -> Job:
            return work(uses={f"tenant:{tenant}": 1}, group=tenant)
    else:
        env = limits_env(group_limits={"a": 1, "b": 1})
        row, lookup = Limit, {"name": "group:a"}
        Limit.objects.bulk_create([Limit(name="group:a"), Limit(name="group:b")])

        def job(tenant: str) -> Job:
            return work(group=tenant)

    fleet = [start_worker("--concurrency", "2", *FAST, env=env) for _ in range(2)]
    for worker in fleet:
        worker.wait_registered()
    b_jobs = []
    with holding(row, **lookup):
        held_at = time.monotonic()
        with transaction.atomic():
            a_jobs = [job("a") for _ in range(3)]
        while time.monotonic() - held_at < HOLD - BOUND:
            b_jobs.append(job("b"))
            time.sleep(1.0)
        poll(lambda: not Job.objects.filter(pk__in=[j.pk for j in b_jobs], started_at=None)
             .exists(), timeout=BOUND)  # fmt: skip
        assert not Job.objects.filter(pk__in=[j.pk for j in a_jobs]).exclude(started_at=None)
    released = time.time()
    ids = [j.pk for j in a_jobs + b_jobs]
    poll(lambda: Job.objects.filter(pk__in=ids, state="done").count() == len(ids), timeout=60)
    waits = [
        (started - created).total_seconds()
        for created, started in Job.objects.filter(pk__in=[j.pk for j in b_jobs]).values_list(
            "created_at", "started_at"
        )
    ]
    assert len(waits) >= 10 and max(waits) < BOUND, waits
    print(f"B's jobs started {max(waits):.2f}s at most after their enqueue")
    first_a = min(Job.objects.filter(pk__in=[j.pk for j in a_jobs]).values_list(
        "started_at", flat=True)).timestamp()  # fmt: skip
    assert first_a - released < BOUND, first_a - released
    print(f"A's first job started {first_a - released:.2f}s after the hold ended")
    for worker in fleet:
        assert worker.stop() == 0, worker.output()
        assert_clean_log(worker.output())
