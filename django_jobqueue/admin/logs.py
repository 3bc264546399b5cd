"""The job page's log lines: what the handler logged through `ctx.logger`, by attempt."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from .. import conf
from ..models import Job, JobLogLine
from . import display

# The newest lines the page shows (of every attempt): the others are read through the ORM.
SHOWN_LINES = 1000

type Row = tuple[int, int, dt.datetime, str]  # attempt, level, logged_at, message


def render(job: Job) -> SafeString:
    """The job's log lines, newest attempt first, each attempt in a fold (the newest open)."""
    lines = JobLogLine.objects.filter(job_id=job.pk)
    rows: list[Row] = list(
        lines.order_by("-pk").values_list("attempt", "level", "logged_at", "message")[
            : SHOWN_LINES + 1
        ]
    )
    if not rows:
        kept = conf.get().job_log_level
        return format_html(
            '<p class="jq-log-none">None. What a handler that takes a context logs through '
            "<code>ctx.logger</code> ({} and above) is kept here, by attempt.</p>",
            kept if isinstance(kept, str) else logging.getLevelName(kept),
        )
    more = ""
    if len(rows) > SHOWN_LINES:
        rows = rows[:SHOWN_LINES]
        more = format_html(
            '<p class="jq-log-more">The newest {} of {} lines; the others through the ORM '
            "(<code>JobLogLine.objects.filter(job_id={})</code>).</p>",
            SHOWN_LINES,
            lines.count(),
            job.pk,
        )
    rows.reverse()
    attempts: dict[int, list[Row]] = {}
    for row in rows:
        attempts.setdefault(row[0], []).append(row)
    newest = max(attempts)
    folds = format_html_join(
        "",
        '<details class="jq-log-attempt"{}><summary>attempt {} &middot; {}</summary>{}</details>',
        (
            (
                " open" if attempt == newest else "",
                attempt,
                "1 line" if len(group) == 1 else f"{len(group)} lines",
                _table(group),
            )
            for attempt, group in sorted(attempts.items(), reverse=True)
        ),
    )
    return format_html("{}{}", more, folds)


def _table(rows: Iterable[Row]) -> SafeString:
    body = format_html_join(
        "",
        '<tr class="jq-log-{}"><td>{}</td><td>{}</td><td><pre class="jq-message">{}</pre></td>'
        "</tr>",
        (
            (
                _level_class(level),
                display.moment(logged_at),
                logging.getLevelName(level),
                message,
            )
            for _, level, logged_at, message in rows
        ),
    )
    return format_html(
        '<table class="jq-log"><thead><tr><th>logged</th><th>level</th><th>message</th></tr>'
        "</thead><tbody>{}</tbody></table>",
        body,
    )


def _level_class(level: int) -> str:
    if level >= logging.ERROR:
        return "error"
    if level >= logging.WARNING:
        return "warning"
    return "info" if level >= logging.INFO else "debug"
