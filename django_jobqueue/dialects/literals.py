"""Values as the text PostgreSQL reads them, bound as one string parameter."""

from __future__ import annotations

from collections.abc import Iterable


def array(values: Iterable[int | str]) -> str:
    """`values` as the text of a PostgreSQL array, to bind as one string parameter with a cast
    (`%s::bigint[]`, `%s::text[]`). The drivers dump a list element by element in Python: on
    the claim under LIMITS that was most of the client's work binding its statements."""
    return "{" + ",".join(_element(v) for v in values) + "}"


def _element(value: int | str) -> str:
    if type(value) is int:
        return str(value)
    # Quoted, with backslashes and double quotes escaped: any text reads back as it was.
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
