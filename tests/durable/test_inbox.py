"""record_effect(): an effect recorded by key, once per committed key, rolled back with the
writes it guards (the reliability review: each failed on the earlier main)."""

from __future__ import annotations

import pytest
from django.db import transaction

import django_jobqueue as jobqueue
from django_jobqueue.exceptions import JobQueueError
from django_jobqueue.models import Effect
from tests.testapp.models import RunRecord


def usable() -> bool:
    """Whether the current transaction still runs queries (it is not marked for rollback)."""
    return RunRecord.objects.count() >= 0


# -- record_effect(): the inbox ----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_record_effect_is_true_once_per_committed_key() -> None:
    with transaction.atomic():
        assert jobqueue.record_effect("charge:1")
        RunRecord.objects.create(job_id=1, attempt=1)
    with transaction.atomic():  # a re-run: the effect committed, skip it
        assert not jobqueue.record_effect("charge:1")
        assert usable()
    assert RunRecord.objects.filter(job_id=1).count() == 1


@pytest.mark.django_db(transaction=True)
def test_record_effect_rolls_back_with_the_writes_it_guards() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        assert jobqueue.record_effect("charge:2")
        raise RuntimeError("the handler failed before its commit")
    with transaction.atomic():
        assert jobqueue.record_effect("charge:2")  # nothing committed: do it now
    assert Effect.objects.filter(key="charge:2").count() == 1


@pytest.mark.django_db(transaction=True)
def test_record_effect_outside_a_transaction_is_an_error() -> None:
    with pytest.raises(JobQueueError, match="inside"):
        jobqueue.record_effect("charge:3")
    assert not Effect.objects.exists()
