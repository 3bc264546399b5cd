"""The grammar of names: the one check of every name and key that reaches the database.

It imports nothing of the package, so that every module (the exceptions too) may use it;
`validation` re-exports it.
"""

from __future__ import annotations

import re
from typing import Any, Literal

# Characters a name must not hold, and that operator-facing output escapes: C0 and C1 control
# characters and DEL (ESC, CR, BEL... drive the terminal: a name could clear the screen or
# overwrite a line), the line and paragraph separators, and the bidirectional controls, which
# reorder how the rest of a line is shown ("Trojan Source"). Other format characters (Cf), such
# as the zero-width joiner of emoji and of Indic and Persian scripts, are allowed. Surrogates
# too: a str may hold one alone ("\ud800", or a byte that did not decode), which neither a
# database nor a terminal takes (no UTF-8 encodes it).
UNSAFE_CHARS = re.compile(
    r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
    r"\ud800-\udfff]"
)


def printable(text: str) -> str:
    """Return `text` with the characters of UNSAFE_CHARS escaped (\\x1b, \\n, \\u202e, \\ud800)."""
    return UNSAFE_CHARS.sub(lambda m: m[0].encode("unicode_escape").decode("ascii"), text)


def text_problem(text: str) -> str | None:
    """Why a database cannot store `text` (PostgreSQL rejects both), or None."""
    if "\x00" in text:
        return "contains a NUL character, which databases cannot store"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate, which is not valid Unicode"
    return None


Star = Literal["text", "none", "end"]


def name_problem(
    value: Any,
    max_length: int,
    *,
    allow_empty: bool = False,
    allow_control: bool = False,
    star: Star = "text",
) -> str | None:
    """Why `value` cannot be a name of a column of `max_length` characters, or None.

    The one check of every name and key that reaches the database (queues, groups, unique
    keys, handler keys, resources and limits, event keys, step names, schedule and worker
    names): each caller raises its own documented error with the reason, which reads after
    the name's label ("queue " + reason) and shows the name escaped (`printable`). Refused:
    a non-string, an empty string (but with `allow_empty`), more than `max_length`
    characters, text that cannot be encoded as UTF-8 (a lone surrogate) or that holds NUL,
    the characters of UNSAFE_CHARS (but with `allow_control`), and a "*" where `star` does
    not allow one.
    """
    if not isinstance(value, str) or (not value and not allow_empty):
        return f"must be a non-empty string, not {value!r}"
    if len(value) > max_length:
        return f"must be at most {max_length} characters, not {len(value):,}"
    problem = text_problem(value)
    if problem:
        return f"{problem}: {printable(value)!r}"
    unsafe = None if allow_control else UNSAFE_CHARS.search(value)
    if unsafe:
        return (
            f"must not contain control characters: {printable(value)!r} holds "
            f"{printable(unsafe[0])} at position {unsafe.start()}"
        )
    if star == "none" and "*" in value:
        return (
            f"must not contain '*': {printable(value)!r} names one resource (a '*' only ends a "
            "pattern of JOBQUEUE['LIMITS'])"
        )
    if star == "end" and "*" in value[:-1]:
        return (
            f"may hold a '*' only as its last character, where it makes a pattern: "
            f"{printable(value)!r} holds one at position {value.index('*')}"
        )
    return None
