"""The queues page's key limits form: its fields read into what ``set_key_limits`` takes.

Every field is sent; a blank one clears that limit (weight: back to 1), as
a blank cap or rate clears the queue's. Text that is not a number gets the
field's rule (``jobs.key_limits.RULES``), the same words the service gives
a number out of range, so the operator reads one rule whichever it was.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jobs.key_limits import FIELDS, RULES, KeyLimitError


def read_limits(form: Mapping[str, str]) -> dict[str, Any]:
    """The four limits from ``form`` (None where blank); ``KeyLimitError`` names bad fields."""
    values: dict[str, Any] = {}
    errors: dict[str, list[str]] = {}
    for name in FIELDS:
        raw = (form.get(name) or "").strip()
        if not raw:
            values[name] = None
            continue
        try:
            values[name] = int(raw) if name == "concurrency" else float(raw)
        except ValueError:
            errors[name] = [RULES[name]]
    if errors:
        raise KeyLimitError(errors)
    return values


def describe(values: Mapping[str, Any]) -> str:
    """The limits as a sentence's end: ``concurrency 2, rate 10/s`` or ``no limits``."""
    parts = []
    if values.get("concurrency") is not None:
        parts.append(f"concurrency {values['concurrency']}")
    if values.get("rate") is not None:
        parts.append(f"rate {values['rate']:g}/s")
    if values.get("burst") is not None:
        parts.append(f"burst {values['burst']:g}")
    if values.get("weight") not in (None, 1, 1.0):
        parts.append(f"weight {values['weight']:g}")
    return ", ".join(parts) if parts else "no limits"
