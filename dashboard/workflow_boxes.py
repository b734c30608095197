"""A workflow step's box as HTML: the page, its polling answer and WebSocket pushes share it.

Written as Python strings rather than a template partial because a page
draws up to 500 of them and the template engine spent ~0.2 ms per box
(100 ms a page), ``format_html`` still a third of that. Every value from job
data (step names, operations, ids) goes through ``_e`` (``html.escape`` with
quotes), and the box carries no inline script or style, so the page's CSP holds.

The retry form carries no CSRF field: rendered without a request (the relay
renders once per role), it gets the page's token from ``ui.js`` on submit,
as every form in a live push does.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from html import escape

from django.utils.safestring import SafeString, mark_safe

from dashboard.templatetags.dash import job_url
from dashboard.workflow_graph import DepthRow, StepBox


def _e(value: object) -> str:
    """Escaped text for an element or a quoted attribute (``&<>"'``)."""
    return escape(str(value), quote=True)


def _status(box: StepBox) -> str:
    if box.waiting:
        return (
            '<span class="badge state-queued">waiting</span> '
            f'<span class="muted small">{int(box.waiting_for)} to go</span>'
        )
    return f'<span class="badge state-{_e(box.status)}">{_e(box.status)}</span>'


def _waits(box: StepBox) -> str:
    if not box.waits_for:
        return ""
    names = ", ".join(f'<span class="step-ref">{_e(n)}</span>' for n in box.waits_for)
    more = f" and {int(box.waits_more)} more" if box.waits_more else ""
    return f'<div class="wf-waits muted small">after {names}{more}</div>'


def retry_form(step_id: uuid.UUID, back: str) -> str:
    return (
        f'<form method="post" action="{_e(job_url(step_id, "retry"))}" class="wf-step-retry" '
        'data-confirm="Retry this step? The workflow resumes from it.">'
        f'<input type="hidden" name="next" value="{_e(back)}">'
        '<button type="submit" class="button small primary">Retry</button></form>'
    )


def step_box(box: StepBox, *, back: str, can_act: bool, oob: bool = False) -> str:
    """One box: name (a link to the step's job page), operation, live status, what it
    waits for, and Retry for an operator when the step failed or was cancelled."""
    status = _e(box.status)
    return (
        f'<article id="step-{_e(box.id)}" class="wf-step state-border-{status}" '
        f'data-status="{status}"{' hx-swap-oob="true"' if oob else ""}>'
        f'<a class="wf-step-link" href="{_e(job_url(box.id))}">'
        f'<span class="step-name">{_e(box.name)}</span></a>'
        f'<div class="wf-step-op"><code>{_e(box.operation)}</code></div>'
        f'<div class="wf-step-status">{_status(box)}</div>{_waits(box)}'
        f"{retry_form(box.id, back) if can_act and box.can_retry else ''}</article>"
    )


def step_boxes_html(
    boxes: Iterable[StepBox], *, back: str, can_act: bool, oob: bool = False
) -> SafeString:
    """Boxes joined; every value in them was escaped by ``_e``."""
    return mark_safe("".join(step_box(b, back=back, can_act=can_act, oob=oob) for b in boxes))


def attention_html(boxes: Iterable[StepBox], *, back: str, can_act: bool) -> SafeString:
    """A large workflow's steps that ended without success: link, status, Retry."""
    return mark_safe(
        "".join(
            f'<li id="step-{_e(b.id)}"><a href="{_e(job_url(b.id))}">'
            f'<span class="step-name">{_e(b.name)}</span> <code>{_e(b.operation)}</code></a> '
            f"{_status(b)}{retry_form(b.id, back) if can_act and b.can_retry else ''}</li>"
            for b in boxes
        )
    )


def depth_rows_html(
    rows: Iterable[DepthRow], *, workflow_id: uuid.UUID, jobs_url: str
) -> SafeString:
    """A large workflow's table rows: steps per depth by status, each count a link to the
    job list filtered by the workflow and that status."""
    base = f"{jobs_url}?workflow={workflow_id}&status="
    out = []
    for row in rows:
        depth = str(row.first) if row.first == row.last else f"{row.first}–{row.last}"
        cells = "".join(
            f'<td class="num"><a class="chip state-{_e(s)}" href="{_e(base + s)}">{n:,}</a></td>'
            if n
            else '<td class="num"><span class="muted">0</span></td>'
            for s, n in row.counts.items()
        )
        out.append(f'<tr><td>{depth}</td><td class="num">{row.total:,}</td>{cells}</tr>')
    return mark_safe("".join(out))
