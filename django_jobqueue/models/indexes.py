"""Indexes over the rows of one state, whose shape depends on the database."""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models import Q


class StateIndex(models.Index):
    """An index over the rows in one `state`, in the order of `fields`.

    Partial (WHERE state = '<state>') on databases with partial indexes (PostgreSQL, SQLite),
    so a scan of that state stays proportional to its rows however many finished rows the
    table holds. MySQL and MariaDB have no partial indexes: there it is a composite index led
    by `state`. It is declared on the model (rather than created by raw SQL in a migration
    only) because SQLite alters a table by rebuilding it, recreating only the indexes the
    model declares: an index the migration state does not know would be silently dropped.
    """

    state = "ready"

    def __init__(self, *args: Any, state: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if state is not None:
            self.state = state

    def deconstruct(self) -> Any:
        path, args, kwargs = super().deconstruct()
        if type(self) is StateIndex:
            kwargs["state"] = self.state
        return path, args, kwargs

    def _for_database(self, connection: Any) -> models.Index:
        if connection.features.supports_partial_indexes:
            return models.Index(
                fields=list(self.fields), condition=Q(state=self.state), name=self.name
            )
        return models.Index(fields=["state", *self.fields], name=self.name)

    def create_sql(self, model: Any, schema_editor: Any, using: str = "", **kwargs: Any) -> Any:
        return self._for_database(schema_editor.connection).create_sql(
            model, schema_editor, using=using, **kwargs
        )


class ReadyIndex(StateIndex):
    """The claim scan's index: `ready` rows in (priority DESC, id) order (migration 0002)."""

    state = "ready"


class PartialIndex(models.Index):
    """An index over the rows matching `where`, where the database has partial indexes.

    MySQL and MariaDB have none: there it indexes every row, on `fields`. The condition is
    kept apart from Index.condition (which Django's checks flag on MySQL, W037) and applied
    only when the index is created on a database that supports it.
    """

    def __init__(self, *args: Any, where: Q, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.where = where

    def deconstruct(self) -> Any:
        path, args, kwargs = super().deconstruct()
        kwargs["where"] = self.where
        return path, args, kwargs

    def create_sql(self, model: Any, schema_editor: Any, using: str = "", **kwargs: Any) -> Any:
        condition = (
            self.where if schema_editor.connection.features.supports_partial_indexes else None
        )
        index = models.Index(fields=list(self.fields), condition=condition, name=self.name)
        return index.create_sql(model, schema_editor, using=using, **kwargs)
