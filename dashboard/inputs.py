"""Text an operator sends the dashboard (query strings, forms), checked in one place.

PostgreSQL's text and jsonb hold no NUL character, no database encodes a
lone UTF-16 surrogate, and JSON has no NaN or infinity. SQLite would take a
NUL and match on it while PostgreSQL's driver refuses it with a 500, so the
dashboard checks what an operator sends before any query or write sees it,
and behaves the same on both databases:

- a filter that cannot be read is reported on the page and not applied
  (``jobs.selectors.read_job_filters``, which also reads the payload
  filter's JSON), as a malformed date or payload always was;
- a form (an action's POST, with the filter in its query string) carrying
  such text is refused with a 400 before the action runs
  (``dashboard.views.common.action``), so nothing is stored.

What counts as storable text is ``jobs.storable``'s definition, shared with
enqueue and the REST API; this module only applies it to request data.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from jobs.storable import printable, text_problem

__all__ = ["printable", "request_problems", "text_problem"]


def request_problems(*sources: Mapping[str, Any]) -> dict[str, str]:
    """A sentence per field of ``sources`` (QueryDicts) whose name or a value cannot be stored.

    Keys are the fields' printable names; an empty result means every text is fine.
    """
    problems: dict[str, str] = {}
    for source in sources:
        for key, values in _lists(source):
            name = printable(key)
            if reason := text_problem(key):
                problems[name] = f"The name of the field {name!r} {reason}."
                continue
            for value in values:
                if isinstance(value, str) and (reason := text_problem(value)):
                    problems[name] = f"The field {name!r} {reason}."
                    break
    return problems


def _lists(source: Mapping[str, Any]) -> Iterable[tuple[str, list[Any]]]:
    lists = getattr(source, "lists", None)
    if lists is not None:
        return list(lists())
    return [(key, [value]) for key, value in source.items()]
