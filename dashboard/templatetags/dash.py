"""Template filters for the dashboard: formatting only, never marking job data safe.

Every filter here returns plain ``str`` so Django's autoescaping still
applies to whatever job data passes through it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

from django import template
from django.urls import reverse

register = template.Library()


@register.simple_tag
def mounted(path: str) -> str:
    """``path`` under the control plane's mount point (``ws/dashboard/`` at ``/ops/``)."""
    from django_controlplane.mount import mount_prefix

    return mount_prefix() + path


@register.filter
def pretty_json(value: Any) -> str:
    """JSON indented for reading; the template escapes the result like any other text."""
    if value is None:
        return "null"
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


@register.filter
def compact_json(value: Any, limit: int = 300) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= int(limit) else text[: int(limit) - 1] + "…"


@register.filter
def short_id(value: Any) -> str:
    """``0193a1b2…c09f3c``: the head a search by prefix finds, and the random tail.

    A UUIDv7 starts with its time in milliseconds, so its first 8 hex digits are
    the same for every job made within ~65 s; the last 6 tell those apart. The
    job list's search (``q``) takes this form as it is.
    """
    text = str(value)
    return f"{text[:8]}…{text[-6:]}" if len(text) == 36 else text[:8]


@register.filter
def iso(value: datetime | None) -> str:
    return value.isoformat() if value else ""


def _seconds(value: Any) -> float | None:
    if value is None or value == "":
        return None
    if isinstance(value, timedelta):
        return value.total_seconds()
    return float(value)


@register.filter
def duration(value: Any) -> str:
    """``950 ms``, ``4.2 s``, ``3 min 5 s``, ``2 h 10 min``, ``3 d 4 h``."""
    seconds = _seconds(value)
    if seconds is None:
        return "—"
    seconds = max(0.0, seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


@register.filter
def since(start: datetime | None, end: datetime | None) -> str:
    """The duration from ``start`` to ``end`` (``{{ a|since:b }}``)."""
    if not start or not end:
        return "—"
    return duration(end - start)


@register.filter
def get(mapping: Any, key: Any) -> Any:
    try:
        return mapping.get(key)
    except AttributeError:
        return None


@register.filter
def fields_items(fields: Any) -> list[tuple[str, str]]:
    """An event's fields as (key, compact JSON value) pairs, for display only."""
    if not isinstance(fields, dict):
        return [("value", compact_json(fields))] if fields not in (None, "") else []
    return [(str(k), compact_json(v, 200)) for k, v in fields.items()]


@register.filter
def event_fields(fields: Any) -> list[tuple[str, str]]:
    """``fields_items`` without the ``_progress_*`` fields: the progress bar shows those."""
    from dashboard.detail import PROGRESS_PREFIX

    return [(k, v) for k, v in fields_items(fields) if not k.startswith(PROGRESS_PREFIX)]


@register.filter
def progress_only(event: Any) -> bool:
    """True for a tick carrying only progress fields: the timeline shows it compactly."""
    from dashboard.detail import is_progress_only

    return is_progress_only(event)


@register.filter
def starts_attempt(event: Any) -> bool:
    """True for the event each claim writes: it heads an attempt on the timeline."""
    from dashboard.detail import ATTEMPT_EVENT

    return getattr(event, "event", None) == ATTEMPT_EVENT


@register.filter
def progress_value(fields: Any) -> str:
    """An event's progress as ``3 / 10``; ``""`` when it carries none."""
    from dashboard.detail import progress_value as value

    return value(fields)


@register.filter
def job_progress(job: Any) -> Any:
    """The progress figures of a job row (None when it reports none)."""
    from dashboard.detail import progress_of

    return progress_of(job)


@register.filter
def intcomma_plain(value: Any) -> str:
    """``1234567`` as ``1,234,567`` (without loading django.contrib.humanize)."""
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError):
        return str(value)


@register.filter
def split_words(value: str) -> list[str]:
    return value.split()


@register.filter
def utc(value: datetime | None, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    """A timestamp in UTC as plain text: cheaper than ``|date`` (no locale lookups),
    which matters on a timeline of hundreds of entries."""
    if not value:
        return ""
    if value.tzinfo is not None:
        value = value.astimezone(UTC)
    return value.strftime(fmt)


@cache
def _job_url_pattern(name: str) -> tuple[str, str]:
    marker = "00000000-0000-0000-0000-000000000000"
    url = reverse(f"dashboard:{name}", args=[marker])
    head, _, tail = url.partition(marker)
    return head, tail


@register.filter
def job_url(job_id: Any, name: str = "job") -> str:
    """``{% url 'dashboard:job' id %}`` without a full URL resolution per row:
    a list of a hundred rows would otherwise spend most of its time reversing."""
    head, tail = _job_url_pattern(name)
    return f"{head}{job_id}{tail}"
