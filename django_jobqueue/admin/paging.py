"""A paginator that never counts the whole table: it counts a few pages ahead at most."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from django.core.paginator import Paginator
from django.http import HttpRequest

PAGES_AHEAD = 5
# Past any list an operator pages through; it bounds the count's LIMIT, which a page number
# from the URL could otherwise push beyond what the database accepts.
MAX_PAGE = 1_000_000


class CappedPaginator(Paginator):  # type: ignore[type-arg]
    """Count the rows up to `PAGES_AHEAD` pages past the current one; `capped` says there are more.

    A COUNT(*) over a million rows costs a scan of them all; counting a bounded subquery
    (SELECT COUNT(*) FROM (SELECT id ... LIMIT n)) costs n rows of the list's own index.
    """

    def __init__(self, object_list: Any, per_page: int, page: int = 1) -> None:
        super().__init__(object_list, per_page)
        self.cap = (min(max(page, 1), MAX_PAGE) + PAGES_AHEAD) * int(per_page)
        self.capped = False

    @cached_property
    def count(self) -> int:
        rows: Any = self.object_list
        found: int = rows.values("pk")[: self.cap + 1].count()
        self.capped = found > self.cap
        return min(found, self.cap)


def capped_paginator(request: HttpRequest, queryset: Any, per_page: int) -> CappedPaginator:
    """Build the paginator of a changelist page from its `p` parameter."""
    try:
        page = int(request.GET.get("p", 1))
    except ValueError:
        page = 1
    return CappedPaginator(queryset, per_page, page)
