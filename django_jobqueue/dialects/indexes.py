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
