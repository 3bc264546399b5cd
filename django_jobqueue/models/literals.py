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
    if not isinstance(value, str):  # None, a bool, a float: never a key or an id
        raise TypeError(f"array() takes ints and strings, not {value!r}")
    # Quoted, with backslashes and double quotes escaped: any text reads back as it was.
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
