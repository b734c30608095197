"""What a failure event records beside its error code and message: a traceback and a fingerprint.

A job's row keeps only the last ``error_code``/``error_message``; the
failure's event (``job.failed``, ``job.retry_scheduled``) keeps the rest in
its ``fields``, so no schema change was needed:

- ``traceback``: the formatted traceback, at most ``MAX_TRACEBACK_BYTES`` of
  UTF-8. Past that the head and the tail are kept around a marker: the head
  says where the run started, the tail names the frame that raised and the
  exception itself, and the middle is usually a repeated recursion.
- ``fingerprint``: a short hash of the error class, the message with its
  variable parts (numbers, UUIDs, hex ids) collapsed, and the innermost
  frame's ``file:function``. Failures that share one are "the same failure"
  however their ids and counts differ; the overview groups by it.

Text no database stores (a NUL, a lone surrogate) is escaped here, not
refused: a traceback is written as a job fails, and a failure must always be
recordable. The remote API refuses such text before it gets this far, as it
does for every other field.
"""

from __future__ import annotations

import hashlib
import re
import traceback as tb
from pathlib import PurePath
from typing import Any

# Bytes of UTF-8 a stored traceback may take (markers included), and of those
# how many come from its head; the rest is its tail.
MAX_TRACEBACK_BYTES = 16 * 1024
HEAD_BYTES = 4 * 1024

# Characters of the message that go into a fingerprint: enough to tell messages
# apart, and the same prefix whether read from an event or from a job row.
FINGERPRINT_MESSAGE_CHARS = 500
FINGERPRINT_LENGTH = 12

_UUID = re.compile(r"[0-9a-fA-F]{8}(?:-?[0-9a-fA-F]{4}){3}-?[0-9a-fA-F]{12}")
_HEX_LITERAL = re.compile(r"\b0[xX][0-9a-fA-F]+\b")
# A run of 8+ hex digits with at least one digit in it: a hash, an address, an id.
_HEX_RUN = re.compile(r"\b(?=[0-9a-fA-F]*[0-9])[0-9a-fA-F]{8,}\b")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_SPACE = re.compile(r"\s+")
# `  File "/srv/app/ops.py", line 12, in resize` (also inside an exception group's `| ` margin).
_FRAME_LINE = re.compile(
    r'^[\s|+\-]*File "(?P<file>[^"\n]*)", line \d+, in (?P<func>[^\n]+)$', re.MULTILINE
)


def storable_text(text: str) -> str:
    """``text`` with NUL characters and lone surrogates escaped, so any database stores it."""
    text = text.replace("\x00", "\\x00")
    try:
        text.encode()
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def bound_traceback(text: str, limit: int = MAX_TRACEBACK_BYTES, head: int = HEAD_BYTES) -> str:
    """``text`` cut to at most ``limit`` bytes of UTF-8: its head and tail around a marker.

    The cut falls on character boundaries (a split character is dropped), and
    the marker says how many bytes were left out.
    """
    data = text.encode("utf-8", "backslashreplace")
    if len(data) <= limit:
        return text
    # The marker's length depends on the number it carries: size it for the worst case.
    room = limit - len(_marker(len(data)).encode())
    head = min(head, room // 2)
    tail = room - head
    kept_head = data[:head].decode("utf-8", "ignore")
    kept_tail = data[len(data) - tail :].decode("utf-8", "ignore")
    omitted = len(data) - len(kept_head.encode()) - len(kept_tail.encode())
    return f"{kept_head}{_marker(omitted)}{kept_tail}"


def _marker(omitted: int) -> str:
    return f"\n[… {omitted} bytes of traceback omitted …]\n"


def format_traceback(error: BaseException) -> str:
    """The traceback Python prints for ``error`` (causes included), storable and bounded."""
    try:
        text = "".join(tb.format_exception(error))
    except Exception:  # noqa: BLE001 - a failure must be recorded even if formatting fails
        text = f"{type(error).__name__}: (the traceback could not be formatted)\n"
    return bound_traceback(storable_text(text))


def _frame_name(filename: str, function: str) -> str:
    # The file's name without its directory: the same code installed under
    # another prefix (a venv, a container) gives the same fingerprint.
    return f"{PurePath(filename).name}:{function.strip()}"


def innermost_frame(error: BaseException) -> str:
    """``file:function`` of the frame that raised ``error``, or "" when it has no traceback."""
    frame = error.__traceback__
    if frame is None:
        return ""
    while frame.tb_next is not None:
        frame = frame.tb_next
    code = frame.tb_frame.f_code
    return _frame_name(code.co_filename, code.co_name)


def frame_from_text(text: str) -> str:
    """``file:function`` of the last frame line of a formatted traceback, or "".

    For tracebacks that arrive as text (a remote worker's): the last frame
    printed is the innermost one of the exception printed last, the one raised.
    """
    frames = _FRAME_LINE.findall(text)
    return _frame_name(*frames[-1]) if frames else ""


def normalise_message(message: str) -> str:
    """``message`` with its variable parts collapsed: UUIDs, hex ids, numbers, runs of space."""
    text = message[:FINGERPRINT_MESSAGE_CHARS]
    text = _UUID.sub("<uuid>", text)
    text = _HEX_LITERAL.sub("<hex>", text)
    text = _HEX_RUN.sub("<hex>", text)
    text = _NUMBER.sub("<n>", text)
    return _SPACE.sub(" ", text).strip()


def fingerprint(error_code: str, message: str, frame: str = "") -> str:
    """A short hash naming one kind of failure: error class, normalised message, raising frame."""
    key = "\x1f".join((error_code, normalise_message(message), frame))
    return hashlib.sha256(key.encode("utf-8", "backslashreplace")).hexdigest()[:FINGERPRINT_LENGTH]


def failure_fields(
    error_code: str, error_message: str, *, traceback: str = "", frame: str | None = None
) -> dict[str, Any]:
    """The ``fingerprint`` (and ``traceback`` when there is one) of a failure event's fields.

    ``frame`` is the raising frame when the caller holds the exception;
    otherwise it is read from ``traceback``. The traceback is bounded and
    made storable here, whoever formatted it.
    """
    if frame is None:
        frame = frame_from_text(traceback)
    fields: dict[str, Any] = {"fingerprint": fingerprint(error_code, error_message, frame)}
    if traceback:
        fields["traceback"] = bound_traceback(storable_text(traceback))
    return fields
