"""Reading ``JobFilters`` from a query string (a QueryDict) or a JSON object.

One reader for every face, so the REST API, the ``jobs`` command, the admin
and the dashboard accept the same names and spellings and refuse the same
mistakes with the same sentences:

- ``status``, ``queue`` and ``operation`` take several values (repeated or
  comma-separated, or a JSON list);
- ``parent`` takes a job id or ``none`` (top-level jobs only); ``schedule``
  a schedule id (the jobs it fired);
- ``created_after`` (or ``from``) and ``created_before`` (or ``to``) take
  ISO 8601 timestamps; ``range`` a window ending now (``15m`` … ``7d``);
- ``when`` is ``scheduled`` or ``retrying`` (queued jobs waiting for later);
- ``q`` is free text; ``payload`` a JSON object the payload must contain;
- ``ids`` (bulk actions only) a list of job ids.

Two ways to be told about a mistake: ``job_filters_from_query`` raises
``InvalidFilter`` naming each field (the API, the command), and
``read_job_filters`` never raises and keeps a sentence per field in
``JobFilters.errors``, applying the rest (a page that shows the mistake
beside its field). Text no database can hold (a NUL, a lone surrogate) is
refused here, before any query carries it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from jobs import waiting
from jobs.selectors.filters import RANGES, STATES, JobFilters
from jobs.selectors.payload import InvalidJSON, parse_json_object
from jobs.selectors.values import InvalidFilter, parse_timestamp, parse_uuid
from jobs.storable import printable, text_problem

# Every name the reader takes, in the order a URL writes them.
FILTER_KEYS: tuple[str, ...] = (
    "status",
    "when",
    "queue",
    "operation",
    "parent",
    "schedule",
    "workflow",
    "range",
    "from",
    "to",
    "created_after",
    "created_before",
    "q",
    "payload",
)
# The two spellings of each time bound: the API's and the short one of shared links.
AFTER = ("created_after", "from")
BEFORE = ("created_before", "to")
Q_MAX = 200
# How a field is named in a sentence about it.
LABELS = {
    "status": "status",
    "when": "waiting",
    "queue": "queue",
    "operation": "operation",
    "parent": "parent job",
    "schedule": "schedule",
    "workflow": "workflow",
    "range": "created",
    "from": "from",
    "to": "to",
    "created_after": "created_after",
    "created_before": "created_before",
    "q": "search",
    "payload": "payload",
}


def job_filters_from_query(data: Mapping[str, Any], *, allow_ids: bool = False) -> JobFilters:
    """The filters in ``data``; ``InvalidFilter`` naming each field that could not be read."""
    filters = read_job_filters(data, allow_ids=allow_ids)
    if filters.errors:
        raise InvalidFilter({name: [message] for name, message in filters.errors.items()})
    return filters


def read_job_filters(data: Mapping[str, Any], *, allow_ids: bool = False) -> JobFilters:
    """The filters in ``data``, never raising: what cannot be read is in ``errors``, unapplied."""
    return _Reader(data).read(allow_ids=allow_ids)


class _Reader:
    def __init__(self, data: Mapping[str, Any]) -> None:
        self.data = data
        self.errors: dict[str, str] = {}
        self.raw: dict[str, str] = {}

    def read(self, *, allow_ids: bool) -> JobFilters:
        statuses = self.statuses()
        texts = {name: self.texts(name) for name in ("queue", "operation")}
        parent, top_level = self.parent()
        schedule = self.identifier("schedule", "The schedule must be a schedule id.")
        workflow = self.identifier("workflow", "The workflow must be a workflow id.")
        after = self.bound(AFTER, max)
        before = self.bound(BEFORE, min)
        when = self.choice("when", waiting.KINDS, f"Choose {' or '.join(waiting.KINDS)}")
        range_ = self.choice("range", tuple(RANGES), "Choose a range from the list:")
        q = self.q()
        payload, payload_text = self.payload()
        ids = self.ids() if allow_ids else ()
        return JobFilters(
            status=tuple(dict.fromkeys(statuses)),
            queue=texts["queue"],
            operation=texts["operation"],
            parent=parent,
            top_level=top_level,
            created_after=after,
            created_before=before,
            range=range_,
            when=when,
            q=q,
            payload=payload,
            ids=ids,
            schedule=schedule,
            workflow=workflow,
            errors=self.errors,
            raw=self.raw,
            payload_text=payload_text,
        )

    # --- reading values -----------------------------------------------------------

    def values(self, name: str) -> list[Any]:
        """Every value given for ``name``: repeated query keys, lists, or comma-separated text."""
        raw: list[Any]
        getlist = getattr(self.data, "getlist", None)
        if getlist is not None:
            raw = list(getlist(name))
        else:
            value = self.data.get(name)
            raw = (
                [] if value is None else list(value) if isinstance(value, list | tuple) else [value]
            )
        if raw:
            self.raw[name] = printable(",".join(v for v in raw if isinstance(v, str)))
        if self.unstorable(name, *(v for v in raw if isinstance(v, str))):
            return []
        out: list[Any] = []
        for item in raw:
            if isinstance(item, str):
                out.extend(part.strip() for part in item.split(",") if part.strip())
            else:
                out.append(item)
        return out

    def single(self, name: str) -> Any:
        """The one value of ``name`` (the last of a repeated query key); None when blank."""
        value = self.data.get(name)
        if isinstance(value, str):
            self.raw[name] = printable(value)
            if self.unstorable(name, value):
                return None
            value = value.strip()
        return None if value is None or value == "" else value

    def unstorable(self, name: str, *texts: str) -> bool:
        """Report text no database can hold (a NUL, a lone surrogate); True if there was some."""
        for text in texts:
            if reason := text_problem(text):
                self.errors[name] = f"The {LABELS[name]} filter {reason}."
                return True
        return False

    def statuses(self) -> list[str]:
        given = self.values("status")
        statuses = [s for s in given if isinstance(s, str)]
        unknown = [s for s in statuses if s not in STATES]
        if len(statuses) != len(given):
            self.errors["status"] = "'status' must be a string or a list of strings."
            return []
        if unknown:
            # repr() escapes NUL and lone surrogates, so the message itself is storable text.
            named = ", ".join(repr(s[:40]) for s in unknown[:5])
            self.errors["status"] = f"Unknown status {named}; use one of {', '.join(STATES)}."
        return [s for s in statuses if s in STATES]

    def texts(self, name: str) -> tuple[str, ...]:
        values = self.values(name)
        if any(not isinstance(v, str) for v in values):
            self.errors[name] = f"'{name}' must be a string or a list of strings."
            return ()
        return tuple(dict.fromkeys(values))

    def parent(self) -> tuple[uuid.UUID | None, bool]:
        value = self.single("parent")
        if value is None:
            return None, False
        if isinstance(value, str) and value.lower() in {"none", "null"}:
            return None, True
        parent = parse_uuid(value)
        if parent is None:
            self.errors["parent"] = "'parent' must be a job id (a UUID) or 'none'."
        return parent, False

    def identifier(self, name: str, message: str) -> uuid.UUID | None:
        value = self.single(name)
        if value is None:
            return None
        found = parse_uuid(value)
        if found is None:
            self.errors[name] = message
        return found

    def bound(self, names: tuple[str, ...], pick: Any) -> datetime | None:
        """One time bound from either spelling (the tighter when both); none if either is bad."""
        found: list[datetime] = []
        bad = False
        for name in names:
            value = self.single(name)
            bad = bad or name in self.errors
            if value is None:
                continue
            stamp = parse_timestamp(value)
            if stamp is None:
                self.errors[name] = (
                    f"'{name}' must be a date and time (ISO 8601, UTC) between years "
                    "1 and 9999, such as 2025-01-31T14:00."
                )
                bad = True
            else:
                found.append(stamp)
        return None if bad or not found else pick(found)

    def choice(self, name: str, allowed: tuple[str, ...], lead: str) -> str:
        value = self.single(name)
        if value is None:
            return ""
        if value not in allowed:
            if lead.endswith(":"):
                self.errors[name] = f"{lead} {', '.join(allowed)}."
            else:
                self.errors[name] = f"{lead} for the waiting jobs."
            return ""
        return str(value)

    def q(self) -> str:
        value = self.single("q")
        if value is None:
            return ""
        if not isinstance(value, str):
            self.errors["q"] = "'q' must be a string."
            return ""
        return value[:Q_MAX].strip()

    def payload(self) -> tuple[dict[str, Any] | None, str]:
        value = self.single("payload")
        if value is None:
            return None, self.raw.get("payload", "").strip() if "payload" in self.errors else ""
        text = value if isinstance(value, str) else ""
        try:
            if isinstance(value, dict):
                text = json.dumps(value, ensure_ascii=False, allow_nan=True)
            elif not isinstance(value, str):
                raise InvalidJSON("'payload' must be a JSON object.")
            return parse_json_object(text), text
        except (InvalidJSON, ValueError, RecursionError) as error:
            message = str(error) if isinstance(error, InvalidJSON) else "Write a JSON object."
            self.errors["payload"] = message
            return None, printable(text)

    def ids(self) -> tuple[uuid.UUID, ...]:
        given = self.data.get("ids")
        if given is None:
            return ()
        if not isinstance(given, list | tuple):
            self.errors["ids"] = "'ids' must be a list of job ids."
            return ()
        ids = [i for i in (parse_uuid(v) for v in given) if i is not None]
        if len(ids) != len(given):
            self.errors["ids"] = "Every entry of 'ids' must be a job id (a UUID)."
            return ()
        if not ids:
            self.errors["ids"] = "'ids' is empty: name at least one job."
        return tuple(dict.fromkeys(ids))
