"""Search inside a job's arguments from the jobs list: `args.tenant_id=42 args.user.name="Ann"`.

The grammar (docs: reference/admin.md, Search):

    search  := clause (" " clause)*          every clause must hold
    clause  := "args." key ("." key)* "=" value
    key     := letters, digits, "_" or "-" (a digit-only key is a list index on a list)
    value   := "quoted string" (JSON escapes) | true | false | null | number | bare text

A value that reads as a number, quoted or not, matches that number or the same text stored as
a string (`42` finds 42 and "42"); quotes group a value with spaces; other text is a string.
Each clause is a JSON key lookup of the ORM (PostgreSQL `->`, MySQL and SQLite
`JSON_EXTRACT`), so it works on every database. Where an index answers containment
(PostgreSQL's GIN index of the arguments, migration 0025), each clause also tests
`args @> {"tenant_id": 42}`, which holds whenever the lookup does: the index finds the few
rows, the lookup decides. A clause with a list index (a digit-only key) has no such test.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from django.db.models import Q, QuerySet
from django.db.models.fields.json import KeyTransform

from ..dialects import get_dialect
from ..models import Job

PREFIX = "args."
MAX_CLAUSES = 5
MAX_DEPTH = 8
KEY = re.compile(r"[A-Za-z0-9_-]+")
# One clause: the path up to the first "=", then a quoted string or a run of non-spaces.
CLAUSE = re.compile(r'args\.([^=\s]*)=("(?:[^"\\]|\\.)*"|\S*)(?:\s+|$)')
LITERALS = {"true": True, "false": False, "null": None}


class SearchError(ValueError):
    """A search for arguments that does not follow the grammar; its text says why."""


def wanted(term: str) -> bool:
    """Whether `term` is a search inside the arguments (it starts with `args.`)."""
    return term.startswith(PREFIX)


def parse(term: str) -> list[tuple[list[str], list[Any]]]:
    """The (key path, accepted values) of each clause of `term`; SearchError if malformed."""
    clauses: list[tuple[list[str], list[Any]]] = []
    at = 0
    while at < len(term):
        match = CLAUSE.match(term, at)
        if match is None:
            raise SearchError(
                f"Cannot read {term[at:at + 40]!r}: write args.<key>=<value>, for example "
                'args.tenant_id=42 or args.user.name="Ann Lee".'
            )  # fmt: skip
        path, raw = match.group(1), match.group(2)
        keys = path.split(".")
        if not path or not all(KEY.fullmatch(key) for key in keys):
            raise SearchError(
                f"Bad key path {path!r} in {match.group(0).strip()!r}: keys are letters, "
                "digits, _ and -, joined by dots."
            )
        if len(keys) > MAX_DEPTH:
            raise SearchError(f"Key path {path!r} is deeper than {MAX_DEPTH} keys.")
        clauses.append((keys, _values(raw, match.group(0).strip())))
        at = match.end()
    if len(clauses) > MAX_CLAUSES:
        raise SearchError(f"At most {MAX_CLAUSES} args clauses in one search.")
    return clauses


def _values(raw: str, clause: str) -> list[Any]:
    if not raw:
        raise SearchError(f'No value after \'=\' in {clause!r} (search for "" with args.key="").')
    if raw.startswith('"'):
        try:
            text = str(json.loads(raw))
        except ValueError:
            raise SearchError(f"Bad quoted string in {clause!r}.") from None
        if "\x00" in text:  # no database's JSON holds it (PostgreSQL's jsonb refuses it)
            raise SearchError(f"A NUL character cannot be searched for ({clause!r}).")
    elif raw in LITERALS:
        return [LITERALS[raw]]
    else:
        text = raw
    try:
        # NaN, Infinity and numbers beyond a float (1e400) are text here: JSON has no such
        # number, and a database would refuse the value.
        number = json.loads(text, parse_constant=_not_a_number)
    except ValueError:
        return [text]
    if _a_number(number):
        # The number, or the same text stored as a string, quoted or not: MySQL compares a
        # key's value unquoted (42 = "42"), and every database answers alike this way.
        return [number, text]
    return [text]


def _a_number(value: Any) -> bool:
    """A number every database's JSON holds: finite, and an integer within 64 bits."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) and (isinstance(value, float) or abs(value) < 2**63)


def _not_a_number(name: str) -> Any:
    raise ValueError(name)


def filtered(jobs: QuerySet[Job], clauses: list[tuple[list[str], list[Any]]]) -> QuerySet[Job]:
    """`jobs` whose arguments hold every clause."""
    where = Q()
    indexed = get_dialect(jobs.db).indexes_json_containment
    for n, (keys, values) in enumerate(clauses):
        # Key transforms built one by one, not "args__a__b" keyword lookups: a key named like a
        # lookup ("contains") or holding "__" stays a key. Filtered through an alias, so that
        # the ORM prepares the value as JSON (a string, null) as for a keyword lookup.
        path: Any = "args"
        for key in keys:
            path = KeyTransform(key, path)
        name = f"jq_args_{n}"
        jobs = jobs.alias(**{name: path})
        either = Q()
        for value in values:
            either |= Q(**{f"{name}__exact": value})
        where &= either
        if indexed and not any(key.isdecimal() for key in keys):
            where &= _containing(keys, values)
    return jobs.filter(where)


def _containing(keys: list[str], values: list[Any]) -> Q:
    """`args @> {keys[0]: {...: value}}` for any of `values`: true of every row whose value
    at the path is one of them (the index's test, beside the exact one)."""
    either = Q()
    for value in values:
        document: Any = value
        for key in reversed(keys):
            document = {key: document}
        either |= Q(args__contains=document)
    return either
