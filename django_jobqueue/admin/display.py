"""HTML fragments the job and worker pages share: state badges, links, ages, errors, JSON."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable
from typing import Any

from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from ..models import Job

# Text on these backgrounds is white; chosen to stay apart for colour-blind readers too. The
# badges take them from the stylesheet (static/django_jobqueue/admin.css, .jq-state-<state>),
# which a strict Content-Security-Policy allows where inline styles are refused; the workflow
# picture draws them as SVG fill attributes.
STATE_COLOURS = {
    Job.State.WAITING: "#757575",
    Job.State.SCHEDULED: "#6a1b9a",
    Job.State.READY: "#1565c0",
    Job.State.LEASED: "#ef6c00",
    Job.State.RUNNING: "#e65100",
    Job.State.DONE: "#2e7d32",
    Job.State.DEAD: "#b71c1c",
    Job.State.CANCELLED: "#4e342e",
}
NONE = mark_safe("-")
RELATIVE_UNITS = (("d", 86_400), ("h", 3_600), ("min", 60), ("s", 1))
STYLESHEET = "django_jobqueue/admin.css"


def badge(state: str) -> SafeString:
    """A job state as a coloured label."""
    return format_html('<span class="jq-state jq-state-{}">{}</span>', state, state)


def warn(text: Any) -> SafeString:
    """`text` in the red of a warning."""
    return format_html('<span class="jq-warn">{}</span>', text)


def job_url(pk: int) -> str:
    """The admin page of job `pk`."""
    return reverse("admin:django_jobqueue_job_change", args=[pk])


def paused_note(why: str) -> SafeString:
    """The mark of a job a pause holds back, saying which."""
    return format_html(' <span class="jq-paused" title="{}">paused: {}</span>', why, why)


def job_link(pk: int, state: str | None = None, label: str = "") -> SafeString:
    """A link to job `pk`, with its state beside it when known."""
    link = format_html('<a href="{}">#{}{}</a>', job_url(pk), pk, f" {label}" if label else "")
    return format_html("{} {}", link, badge(state)) if state else link


def job_links(rows: Iterable[tuple[int, str, str]], total: int, more_url: str) -> SafeString:
    """Links to (id, type, state) rows, and to the full list when `total` is larger."""
    rows = list(rows)
    if not rows:
        return NONE
    links = format_html_join(mark_safe("<br>"), "{}", ((job_link(*r[::2], r[1]),) for r in rows))
    if total > len(rows):
        return format_html('{}<br><a href="{}">all {} jobs</a>', links, more_url, total)
    return links


def age(when: dt.datetime | None, now: dt.datetime | None = None) -> str:
    """How long ago `when` was (or how far ahead, with 'in'), as '3s', '2m 05s', '1h 02m'."""
    if when is None:
        return "-"
    seconds = ((now or timezone.now()) - when).total_seconds()
    text = duration(abs(seconds))
    return text if seconds >= 0 else f"in {text}"


def relative(moment: dt.datetime | None, now: dt.datetime) -> str:
    """How far `moment` is from `now`, in one unit: 'in 20 s', '3 min ago', 'in 2 h', '4 d ago'."""
    if moment is None:
        return "-"
    seconds = (moment - now).total_seconds()
    size = abs(seconds)
    if size < 1:
        return "now"
    unit, length = next((u, n) for u, n in RELATIVE_UNITS if size >= n)
    text = f"{int(size // length)} {unit}"
    return f"in {text}" if seconds > 0 else f"{text} ago"


def when(moment: dt.datetime | None) -> str:
    """A moment in the current time zone, to the second."""
    return "-" if moment is None else timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S")


def moment(value: dt.datetime | None) -> SafeString:
    """A moment to the second in the current time zone, with the full time (microseconds,
    UTC offset, and UTC) on hover: a <time> element."""
    if value is None:
        return NONE
    local = timezone.localtime(value)
    full = f"{local.isoformat()} ({value.astimezone(dt.UTC).strftime('%Y-%m-%d %H:%M:%S.%f')} UTC)"
    return format_html(
        '<time datetime="{}" title="{}">{}</time>', value.isoformat(), full, when(value)
    )


def moment_column(field: str, description: str) -> Any:
    """An admin column or read-only field showing a model's datetime `field` as moment()."""

    def show(model_admin: Any, obj: Any) -> SafeString:
        return moment(getattr(obj, field))

    show.short_description = description  # type: ignore[attr-defined]
    return show


def duration(seconds: float) -> str:
    """A number of seconds as '3s', '2m 05s', '1h 02m' or '3d 04h'."""
    whole = int(seconds)
    if whole < 60:
        return f"{seconds:.0f}s" if seconds >= 1 or seconds == 0 else f"{seconds:.1f}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours:02d}h"


def first_line(error: dict[str, Any] | None, limit: int = 120) -> str:
    """The first line of an error entry: its short type and message."""
    if not error:
        return ""
    kind = str(error.get("type") or "").rsplit(".", 1)[-1]
    message = str(error.get("message") or "").strip().splitlines()
    text = f"{kind}: {message[0]}" if message else kind
    return text if len(text) <= limit else text[: limit - 1] + "…"


def pretty_json(value: Any) -> SafeString:
    """A JSON value indented, escaped, in a scrollable block."""
    if value is None:
        return NONE
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    return format_html('<pre class="jq-json">{}</pre>', text)


def errors_table(errors: list[dict[str, Any]] | None) -> SafeString:
    """One row per failed attempt: its number, error, and traceback folded away."""
    if not errors:
        return NONE
    rows = format_html_join(
        "",
        '<tr><td>{}</td><td><strong>{}</strong><pre class="jq-message">{}</pre></td>'
        "<td>{}</td></tr>",
        (
            (
                entry.get("attempt") or "-",
                entry.get("type", ""),
                entry.get("message", ""),
                traceback(entry.get("traceback")),
            )
            for entry in errors
            if isinstance(entry, dict)
        ),
    )
    return format_html(
        '<table class="jq-errors"><thead><tr><th>attempt</th><th>error</th>'
        "<th>traceback</th></tr></thead><tbody>{}</tbody></table>",
        rows,
    )


def traceback(text: Any) -> SafeString:
    """A traceback in a fold, its last line (the error) as the summary."""
    if not text:
        return NONE
    lines = str(text).rstrip().splitlines()
    return format_html(
        '<details><summary>{}</summary><pre class="jq-traceback">{}</pre></details>',
        lines[-1] if lines else "",
        str(text),
    )


def progress_bar(value: dict[str, Any]) -> SafeString:
    """`ctx.progress()`'s last value in a list cell: a bar, and "current of total"."""
    current, total = value.get("current"), value.get("total")
    message = str(value.get("message") or "")
    if not isinstance(current, int | float):
        return NONE
    if isinstance(total, int | float) and total > 0:
        return format_html(
            '<progress max="{}" value="{}" title="{}"></progress> {}/{}',
            total, current, message, f"{current:g}", f"{total:g}",
        )  # fmt: skip
    return format_html('<span title="{}">{}</span>', message, f"{current:g}")
