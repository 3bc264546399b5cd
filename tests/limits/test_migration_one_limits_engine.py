"""Migration 0015: the group, queue and dynamic caps' lock rows and the group rates' starts move
to the limits engine's tables (Limit, ResourceStart), and back when it is reversed."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("django_jobqueue", "0014_schedule_verbose_names")]
AFTER = [("django_jobqueue", "0015_one_limits_engine")]


def migrate(target):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(target)
    return executor.loader.project_state(target).apps


def test_the_old_limit_tables_move_to_the_engine_and_back():
    at = timezone.now() - dt.timedelta(seconds=5)
    try:
        old = migrate(BEFORE)
        old.get_model("django_jobqueue", "ConcurrencyLimit").objects.bulk_create(
            [old.get_model("django_jobqueue", "ConcurrencyLimit")(key=key)
             for key in ("group:exports", "queue:slow", "dynamic")]
        )  # fmt: skip
        old.get_model("django_jobqueue", "RateLimitStart").objects.create(
            group_key="mail", started_at=at, count=3
        )
        new = migrate(AFTER)
        names = set(
            new.get_model("django_jobqueue", "Limit").objects.values_list("name", flat=True)
        )
        assert names == {"group:exports", "queue:slow"}  # "dynamic" has no successor
        starts = new.get_model("django_jobqueue", "ResourceStart").objects
        assert list(starts.values_list("resource", "units")) == [("group:mail", 3)]
        assert starts.get().started_at == at
        back = migrate(BEFORE)
        keys = back.get_model("django_jobqueue", "ConcurrencyLimit").objects.values_list(
            "key", flat=True
        )
        assert set(keys) == {"group:exports", "queue:slow"}
        rate = back.get_model("django_jobqueue", "RateLimitStart").objects.get()
        assert (rate.group_key, rate.count, rate.started_at) == ("mail", 3, at)
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
