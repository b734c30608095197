"""Options and terminal output of ``manage.py jobs`` (its command module is beside this one).

Option values are checked the way the REST API checks them (its filter
reader, its limit parser), and refusals become ``CommandError`` with exit
code 2, like argparse's own usage errors. Output never passes a job's text
to the terminal raw: a payload or message could hold escape sequences.
"""

from __future__ import annotations

import getpass
import json
import re
import uuid
from argparse import ArgumentTypeError
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.core.serializers.json import DjangoJSONEncoder

from jobs import selectors
from jobs.models import Job
from jobs.operator_actions import normalise_reason

DEFAULT_LIMIT = 50
MAX_LIMIT = 1000
USAGE = 2  # the exit code of bad usage, as argparse's own
CLIP = 60

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


# --- options -------------------------------------------------------------------------


def add_filters(parser: CommandParser) -> None:
    """The filters of ``GET /jobs``; the repeatable ones also take comma-separated values."""
    parser.add_argument(
        "--status", action="append", metavar="STATUS", help=", ".join(selectors.STATES)
    )
    parser.add_argument("--queue", action="append", metavar="QUEUE")
    parser.add_argument("--operation", action="append", metavar="OPERATION")
    parser.add_argument("--parent", metavar="ID", help="A parent job id, or 'none'.")
    parser.add_argument("--q", metavar="TEXT", help="Id (or prefix), operation or error text.")
    parser.add_argument("--created-after", metavar="ISO8601")
    parser.add_argument("--created-before", metavar="ISO8601")
    parser.add_argument("--from", dest="from", metavar="ISO8601", help="As --created-after.")
    parser.add_argument("--to", dest="to", metavar="ISO8601", help="As --created-before.")
    parser.add_argument(
        "--range", metavar="WINDOW", help=f"Created in the last {', '.join(selectors.RANGES)}."
    )
    parser.add_argument(
        "--when", metavar="KIND", help="Queued jobs waiting for later: scheduled or retrying."
    )
    parser.add_argument("--schedule", metavar="ID", help="The jobs a schedule fired.")
    parser.add_argument(
        "--payload", metavar="JSON", help='A JSON object the payload contains: {"account": 42}.'
    )


def add_actor(parser: CommandParser) -> None:
    parser.add_argument(
        "--by",
        default=None,
        metavar="NAME",
        help="Who is acting, for the timeline and the audit log (default: your login name).",
    )


def limit(raw: str) -> int:
    """``--limit``: 1 to ``MAX_LIMIT`` (an argparse type)."""
    try:
        return selectors.parse_limit(raw, default=DEFAULT_LIMIT, maximum=MAX_LIMIT)
    except selectors.InvalidFilter as error:
        raise ArgumentTypeError(" ".join(error.errors["limit"])) from None


def batch_size(raw: str) -> int:
    """``--batch-size``: 1 to 100,000 (an argparse type)."""
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= 100_000:
        raise ArgumentTypeError(f"{raw!r} is not a whole number from 1 to 100000.")
    return value


def age(raw: str) -> timedelta:
    """``--older-than``: ``7d``, ``12h``, ``30m``, ``45s``, ``2w`` or plain seconds."""
    match = _DURATION.match(raw)
    if match is None:
        raise ArgumentTypeError(
            f"{raw!r} is not an age: use a number with s, m, h, d or w (7d, 12h, 30m), "
            "or plain seconds."
        )
    try:
        return timedelta(seconds=float(match[1]) * _UNITS[match[2].lower()])
    except OverflowError:
        raise ArgumentTypeError(f"{raw!r} is longer than any date can reach back.") from None


def usage(message: str) -> CommandError:
    """A refusal of what was typed: exit code 2, like argparse's."""
    return CommandError(message, returncode=USAGE)


def filters(options: dict[str, Any], names: Sequence[str]) -> selectors.JobFilters:
    """The API's filter reader over the options named ``names``; refusals are usage errors."""
    data = {name: options[name] for name in names if options.get(name) not in (None, [], "")}
    try:
        return selectors.job_filters_from_query(data)
    except selectors.InvalidFilter as error:
        problems = "; ".join(
            f"--{field.replace('_', '-')}: {' '.join(messages)}"
            for field, messages in error.errors.items()
        )
        raise usage(f"Invalid filter. {problems}") from None


def job_id(raw: str) -> uuid.UUID:
    pk = selectors.parse_uuid(raw.strip())
    if pk is None:
        raise usage(f"{clip(raw)!r} is not a job id: job ids are UUIDs.")
    return pk


def existing_jobs(ids: Sequence[uuid.UUID]) -> list[Job]:
    """The jobs, in the order given; an unknown id is an error (exit 1) naming it."""
    found = Job.objects.in_bulk(list(ids))
    missing = [str(pk) for pk in ids if pk not in found]
    if missing:
        raise CommandError(f"No job with id {', '.join(missing)} exists.", returncode=1)
    return [found[pk] for pk in ids]


def actor(raw: str | None) -> str:
    """``--by``, or else the login name; a shell that has none acts as ``cli``."""
    if raw is None:
        try:
            return getpass.getuser()
        except (OSError, KeyError):  # no LOGNAME/USER and no passwd entry (a bare container)
            return "cli"
    name = raw.strip()
    if not name or len(name) > 150 or selectors.unstorable_text(name):
        raise usage("--by must be a name of 1 to 150 printable characters.")
    return name


def reason(raw: str) -> str:
    """``--reason``, trimmed as the dashboard trims it."""
    problem = selectors.unstorable_text(raw)
    if problem:
        raise usage(f"--reason: {problem}")
    return normalise_reason(raw)


# --- output --------------------------------------------------------------------------


def to_json(data: Any) -> str:
    """One line of JSON, ASCII only: any terminal or pipe can carry it."""
    return json.dumps(data, cls=DjangoJSONEncoder)


def safe(text: str) -> str:
    """``text`` as a terminal should show it: control characters (an escape sequence in a
    job's message, a newline) and lone surrogates written as Python escapes."""
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode() for ch in text)


def clip(value: Any, width: int = CLIP) -> str:
    text = safe(str(value))
    return text if len(text) <= width else text[: width - 1] + "…"


def field_text(value: Any) -> str:
    """A job field for ``show``: ``-`` when empty, JSON for payloads and results."""
    if value is None or value == "":
        return "-"
    if isinstance(value, (dict, list)):
        return clip(to_json(value), 500)
    return clip(value, 500)


def when(moment: datetime | None, *, ms: bool = False) -> str:
    """A time in UTC, to the second (or millisecond)."""
    if moment is None:
        return "-"
    text = moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    return text[:-3] if ms else text[:-7]


def table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """Left-aligned columns two spaces apart, as wide as their widest cell."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [headers, *rows]
    ]


def count(n: int) -> str:
    return f"{n} job" if n == 1 else f"{n} jobs"
