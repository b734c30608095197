"""JSON log lines, one object per line, for log shippers (docs/observability.md).

``JsonFormatter`` turns any record of the ``jobs`` and ``workers`` loggers
into ``{"ts", "level", "logger", "event", ..., "message"}``. A worker's run
outcome (``job.succeeded``, ``job.failed``, ``job.retry_scheduled`` …) carries
its fields as data (``extra={"controlplane": {...}}``: ``job_id``,
``operation``, ``queue``, ``attempt``, ``duration_ms``, ``status``,
``error_code``, ``error``); other lines are written ``event key=value …`` and
their pairs become fields.

With the knob ``LOG_FORMAT`` = ``json`` (``CONTROLPLANE_LOG_FORMAT=json``) the
worker also logs every claim (``job.claimed``) and success at INFO, which are
DEBUG otherwise, so each state change a worker makes is one line. The demo
settings (``controlplane/settings.py``) switch their formatter on the same
variable; a host project names this class in its own ``LOGGING``.
"""

from __future__ import annotations

import ast
import functools
import json
import logging
import re
from datetime import UTC, datetime
from typing import Any

# The record attribute that carries a line's fields as data.
FIELDS_ATTRIBUTE = "controlplane"
RESERVED = frozenset({"ts", "level", "logger", "event", "message"})
_EVENT = re.compile(r"^[a-z_]+(?:\.[a-z_]+)+$")
_PAIR = re.compile(r"""(\w+)=('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|\S+)""")
_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?$")


@functools.cache
def json_logs() -> bool:
    """True when the knob ``LOG_FORMAT`` is ``json`` (read once per process)."""
    from jobs.conf import knob

    return str(knob("LOG_FORMAT")).strip().lower() == "json"


def state_line_level(level: int) -> int:
    """The level of a job state-change line: raised to INFO when JSON logs are on."""
    return max(level, logging.INFO) if json_logs() else level


def _value(text: str) -> Any:
    if text[:1] in ("'", '"'):
        try:
            return ast.literal_eval(text)
        except (SyntaxError, ValueError):
            return text
    if _NUMBER.match(text):
        return float(text) if "." in text else int(text)
    return text


def parse_line(message: str) -> tuple[str, dict[str, Any]]:
    """``"job.requeued job_id=1 reason=shutdown"`` -> ``("job.requeued", {"job_id": "1", …})``."""
    head, _, rest = message.partition(" ")
    if not _EVENT.match(head):
        return "", {}
    fields: dict[str, Any] = {}
    for key, raw in _PAIR.findall(rest):
        fields[f"{key}_text" if key in RESERVED else key] = _value(raw)
    return head, fields


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, event, fields, message."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        data = getattr(record, FIELDS_ATTRIBUTE, None)
        event, parsed = parse_line(message)
        if event:
            line["event"] = event
        if isinstance(data, dict):
            line.update({k: v for k, v in data.items() if k not in RESERVED})
        else:
            line.update(parsed)
        line["message"] = message
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)
