"""The ready-set index, whose shape depends on the database."""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models import Q


class ReadyIndex(models.Index):
    """The claim scan's index: `ready` rows in (priority DESC, id) order.

    Partial (WHERE state = 'ready') on databases with partial indexes (PostgreSQL, SQLite), so
    the claim scan stays proportional to the ready set however many finished rows the table
    holds. MySQL and MariaDB have no partial indexes: there it is a composite index led by
    `state`. It is declared on the model (rather than created by raw SQL in a migration only)
    because SQLite alters a table by rebuilding it, recreating only the indexes the model
    declares: an index the migration state does not know would be silently dropped.
    """

    def _for_database(self, connection: Any) -> models.Index:
        if connection.features.supports_partial_indexes:
            return models.Index(
                fields=["-priority", "id"], condition=Q(state="ready"), name=self.name
            )
        return models.Index(fields=["state", "-priority", "id"], name=self.name)

    def create_sql(self, model: Any, schema_editor: Any, using: str = "", **kwargs: Any) -> Any:
        return self._for_database(schema_editor.connection).create_sql(
            model, schema_editor, using=using, **kwargs
        )
