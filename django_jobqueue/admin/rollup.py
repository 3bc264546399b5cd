"""A workflow at a glance: a container's (or a spawning job's) children counted by state, its
progress, how long it has run and when it should end, and its failed children made obvious.

A job's page counts its children with one GROUP BY on the parent index (its cost grows with
the children: a few milliseconds for 2,000); a list row looks at most at LIST_SAMPLE of them.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable
from typing import Any

from django.db.models import Count
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ..dialects import get_dialect
from ..models import Job
from . import display, graph

RATE_WINDOW = dt.timedelta(minutes=5)  # the recent pace an expected finish is read from
LIST_SAMPLE = 1000  # children of one workflow a list row looks at


def is_workflow(job: Job) -> bool:
    """Whether the job has children: a container, or a job that spawned some."""
    return bool(job.is_container or job.has_children)


def counts(parent_ids: Iterable[int]) -> dict[int, dict[str, int]]:
    """{parent id: {state: children in it}} for the given parents."""
    ids = list(parent_ids)
    found: dict[int, dict[str, int]] = {pk: {} for pk in ids}
    if not ids:
        return found
    rows = (
        Job.objects.filter(parent_id__in=ids)
        .values_list("parent_id", "state")
        .annotate(n=Count("pk"))
        .order_by()
    )
    for parent, state, n in rows:
        found[parent][state] = n
    return found


def sampled(parent_ids: Iterable[int]) -> dict[int, dict[str, int]]:
    """{parent id: {state: children}} over at most LIST_SAMPLE children of each parent: what a
    list page shows, bounded however large a workflow is (one small query per workflow)."""
    found: dict[int, dict[str, int]] = {}
    for pk in parent_ids:
        states = Job.objects.filter(parent_id=pk).order_by().values_list("state", flat=True)
        found[pk] = dict(Counter(states[:LIST_SAMPLE]))
    return found


def badge_note(by_state: dict[str, int]) -> SafeString | str:
    """What a list row adds to a workflow's state: final of all, and any failed child in red
    (over the first LIST_SAMPLE children: "1,000+" beyond)."""
    total = sum(by_state.values())
    if not total:
        return ""
    failed = [(state, by_state[state]) for state in Job.FAILED_STATES if by_state.get(state)]
    bad = format_html_join(" ", " {}", ((display.warn(f"{n} {state}"),) for state, n in failed))
    of = f"{total:,}+" if total >= LIST_SAMPLE else f"{total:,}"
    return format_html(
        ' <span class="jq-rollup">{} of {} final{}</span>', f"{final(by_state):,}", of, bad
    )


def final(by_state: dict[str, int]) -> int:
    return sum(by_state.get(state, 0) for state in Job.TERMINAL_STATES)


def summary(job: Job) -> SafeString:
    """The page's view: counts by state (each a link), a bar, the time so far, the pace."""
    by_state = counts([int(job.pk)])[int(job.pk)]
    total = sum(by_state.values())
    if not total:
        return format_html("{}", "no children yet")
    cells = format_html_join(
        " ",
        '<a href="{}">{} {}</a>',
        (
            (graph.changelist(container=job.pk) + f"&state={state}", display.badge(state), n)
            for state, n in sorted(by_state.items(), key=lambda kv: _order(kv[0]))
        ),
    )
    done = final(by_state)
    failed = sum(by_state.get(state, 0) for state in Job.FAILED_STATES)
    alarm = (
        format_html(
            '<p class="jq-warn">{} of its children failed: <a href="{}">see them</a>.</p>',
            failed,
            graph.changelist(container=job.pk) + "&state=failed",
        )
        if failed
        else ""
    )
    return format_html(
        '<div class="jq-rollup-summary"><progress max="{}" value="{}"></progress> {} of {} '
        "children final ({}%)<br>{}<br>{}</div>{}",
        total,
        done,
        done,
        total,
        done * 100 // total,
        cells,
        pace(job, done, total),
        alarm,
    )


def pace(job: Job, done: int, total: int) -> str:
    """How long the workflow has run, and when it should end at the pace of RATE_WINDOW."""
    now = get_dialect(Job.objects.db).now()
    started = job.created_at
    ran = display.duration(max(0.0, (now - started).total_seconds()))
    if job.state in Job.TERMINAL_STATES:
        ended = job.finished_at or now
        return f"took {display.duration(max(0.0, (ended - started).total_seconds()))}"
    recent = Job.objects.filter(
        parent_id=job.pk,
        state__in=Job.TERMINAL_STATES,
        finished_at__gte=now - RATE_WINDOW,
    ).count()
    if not recent or done >= total:
        return f"running for {ran}; no child finished in the last {_minutes()}"
    per_second = recent / min(RATE_WINDOW.total_seconds(), (now - started).total_seconds() or 1)
    left = (total - done) / per_second
    return (
        f"running for {ran}; {recent} children finished in the last {_minutes()}: "
        f"about {display.duration(left)} left at that pace"
    )


def _minutes() -> str:
    return f"{int(RATE_WINDOW.total_seconds() // 60)} minutes"


def _order(state: str) -> int:
    return list(Job.State.values).index(state) if state in Job.State.values else 99


def annotate_page(rows: Iterable[Any]) -> None:
    """Give the workflows among a list page's rows their children's counts (`rollup`)."""
    rows = list(rows)
    wanted = [int(row.pk) for row in rows if is_workflow(row)]
    found = sampled(wanted)
    for row in rows:
        if int(row.pk) in found:
            row.rollup = found[int(row.pk)]
