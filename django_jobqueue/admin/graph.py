"""The workflow picture: a job's neighbourhood in the DAG, drawn as inline SVG on the server.

Upstream jobs on the left, downstream on the right, the container above and the children
below the job. Each side shows at most BOUND jobs; the rest collapse into one "+N more" node
that links to their list. Nothing is loaded from anywhere: the SVG is part of the page.
"""

from __future__ import annotations

import dataclasses
from urllib.parse import urlencode

from django.db.models import QuerySet
from django.urls import reverse
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from ..models import Job
from .display import STATE_COLOURS, job_url

BOUND = 8
W, H, GAP, COL = 190, 40, 12, 260
MORE = "#9e9e9e"


@dataclasses.dataclass
class Node:
    """A box of the picture: a job, or the collapsed rest of one side."""

    label: str
    detail: str
    colour: str
    url: str
    x: int = 0
    y: int = 0
    current: bool = False


def changelist(**lookup: int) -> str:
    """The jobs changelist filtered by `lookup`."""
    return reverse("admin:django_jobqueue_job_changelist") + "?" + urlencode(lookup)


def side(jobs: QuerySet[Job], more_url: str) -> tuple[list[Node], int]:
    """Up to BOUND nodes of `jobs` (plus a "+N more" node), and how many jobs there are."""
    rows = list(jobs.order_by("pk").values_list("pk", "type", "state")[: BOUND + 1])
    total = len(rows) if len(rows) <= BOUND else jobs.count()
    nodes = [node(*row) for row in rows[:BOUND]]
    if total > BOUND:
        nodes.append(Node(f"+{total - BOUND} more", "collapsed: open the list", MORE, more_url))
    return nodes, total


def node(pk: int, type_: str, state: str) -> Node:
    """The box of one job."""
    label = f"#{pk} {type_}"
    return Node(label if len(label) <= 26 else label[:25] + "…", state, colour(state), job_url(pk))


def colour(state: str) -> str:
    """The fill of a job box in `state`."""
    return str(STATE_COLOURS.get(state, "#000"))  # type: ignore[call-overload]


def neighbourhood(job: Job) -> dict[str, list[Node]]:
    """The nodes around `job`, by where they stand: up, down, parent, children."""
    jobs = Job.objects.all()
    up, _ = side(jobs.filter(downstream_edges__job_id=job.pk), changelist(upstream_of=job.pk))
    down, _ = side(
        jobs.filter(upstream_edges__depends_on_id=job.pk), changelist(downstream_of=job.pk)
    )
    children, _ = side(jobs.filter(parent_id=job.pk), changelist(container=job.pk))
    parent = []
    if job.parent_id is not None:
        row = jobs.filter(pk=job.parent_id).values_list("pk", "type", "state").first()
        parent = [node(*row)] if row else []
    me = node(int(job.pk), job.type, job.state)
    me.current = True
    return {"up": up, "down": down, "parent": parent, "me": [me], "children": children}


def layout(parts: dict[str, list[Node]]) -> tuple[int, int]:
    """Place the nodes; return the picture's width and height."""
    centre = [*parts["parent"], *parts["me"]]
    top = GAP
    for item in centre:
        item.x, item.y = COL, top
        top += H + GAP * 2
    for child in parts["children"]:
        child.x, child.y = COL + 30, top
        top += H + GAP
    me = parts["me"][0]
    for column, nodes in ((0, parts["up"]), (2, parts["down"])):
        start = max(GAP, me.y + H // 2 - (len(nodes) * (H + GAP) - GAP) // 2)
        for index, item in enumerate(nodes):
            item.x, item.y = column * COL + GAP, start + index * (H + GAP)
            top = max(top, item.y + H + GAP)
    return 2 * COL + W + 2 * GAP, top


def render(job: Job) -> SafeString:
    """The SVG picture of `job`'s neighbourhood."""
    parts = neighbourhood(job)
    width, height = layout(parts)
    me = parts["me"][0]
    edges = []
    for item in parts["up"]:
        edges.append(_line(item.x + W, item.y + H // 2, me.x, me.y + H // 2))
    for item in parts["down"]:
        edges.append(_line(me.x + W, me.y + H // 2, item.x, item.y + H // 2))
    for item in parts["parent"]:
        edges.append(_line(me.x + W // 2, item.y + H, me.x + W // 2, me.y, dashed=True))
        edges.append(f'<text x="{me.x + W // 2 + 6}" y="{me.y - 8}" fill="#555">container</text>')
    for item in parts["children"]:
        edges.append(
            f'<path d="M{me.x + 15},{me.y + H} V{item.y + H // 2} H{item.x}" fill="none" '
            'stroke="#555" stroke-dasharray="4 3" marker-end="url(#jq-arrow)"/>'
        )
    boxes = [_box(item) for nodes in parts.values() for item in nodes]
    legend = _legend(height)
    return mark_safe(
        f'<svg class="jq-graph" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height + 30}" viewBox="0 0 {width} {height + 30}" role="img" '
        f'aria-label="workflow of job {job.pk}">'
        '<defs><marker id="jq-arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        'fill="#555"/></marker></defs>' + "".join(edges) + "".join(boxes) + legend + "</svg>"
    )


def _line(x1: int, y1: int, x2: int, y2: int, *, dashed: bool = False) -> str:
    dash = ' stroke-dasharray="4 3"' if dashed else ""
    return (
        f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="#555"{dash} '
        'marker-end="url(#jq-arrow)"/>'
    )


def _box(item: Node) -> str:
    border = 'stroke="#000" stroke-width="3"' if item.current else 'stroke="#fff"'
    return (
        f'<a href="{escape(item.url)}">'
        f"<title>{escape(item.label)} ({escape(item.detail)})"
        f'</title><rect x="{item.x}" y="{item.y}" width="{W}" height="{H}" rx="5" '
        f'fill="{item.colour}" {border}/><text x="{item.x + 8}" y="{item.y + 16}" fill="#fff" '
        f'font-weight="bold">{escape(item.label)}</text><text x="{item.x + 8}" '
        f'y="{item.y + 32}" fill="#fff">{escape(item.detail)}</text></a>'
    )


def _legend(top: int) -> str:
    items = []
    for index, (state, fill) in enumerate(STATE_COLOURS.items()):
        x = GAP + index * 85
        items.append(
            f'<rect x="{x}" y="{top + 8}" width="12" height="12" fill="{fill}"/>'
            f'<text x="{x + 16}" y="{top + 18}">{escape(str(state))}</text>'
        )
    return "".join(items)
