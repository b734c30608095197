"""A job's payload as the JSON text it is stored as: encoded once, refused when unstorable.

The text is what the enqueue statement sends (``jobs.enqueue_statement``
splices it in as it is), so it is made once per payload, by one C encoder
per thread rather than one per call.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from jobs.storable import first_unstorable

_encoder = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=False)
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)


class _PayloadEncoder(threading.local):
    """``_encoder.encode`` with one C encoder per thread instead of one per call.

    ``JSONEncoder.encode`` builds a C encoder for every call, which costs
    more than encoding a small payload. The encoder's ``markers`` (the
    containers being encoded, for the circular-reference check) are empty
    after each success and cleared after a failure; per thread, so two
    threads encoding the same dict never see each other's marks.
    """

    def __init__(self) -> None:
        self.markers: dict[int, Any] = {}
        self.encode = (
            _c_make_encoder(
                self.markers,
                _encoder.default,
                json.encoder.encode_basestring,  # ensure_ascii=False
                None,
                ":",
                ",",
                False,
                False,
                False,  # allow_nan
            )
            if _c_make_encoder is not None
            else None
        )


_payload_encoder = _PayloadEncoder()


def dumps(value: Any) -> str:
    """``value`` as compact JSON (no NaN, no ASCII escaping), like ``_encoder.encode``."""
    local = _payload_encoder
    if local.encode is None:  # pragma: no cover - CPython has the C encoder
        return _encoder.encode(value)
    try:
        return "".join(local.encode(value, 0))
    except BaseException:
        local.markers.clear()
        raise


def encode_payload(payload: dict[str, Any], limit: int) -> tuple[str, dict[str, list[str]]]:
    """Serialise a payload once and refuse what PostgreSQL and SQLite would store differently.

    Returns the JSON text and no errors, or no text and the errors by field.
    NaN and infinities are not JSON; NUL (``\\u0000``) is refused by
    PostgreSQL's jsonb and lone surrogates are not Unicode. Both databases
    refuse them here, before anything is stored, as they refuse a payload
    over ``limit`` bytes.
    """
    if not payload:
        return "{}", {}
    try:
        text = dumps(payload)
    except ValueError as error:  # a non-finite float (allow_nan=False), or a cycle
        if "ircular" in str(error):
            return "", {"payload": ["The payload is not JSON: it refers to itself."]}
        found = first_unstorable(payload) or ("payload", f"is not JSON ({error})")
        return "", {found[0]: [f"The value {found[1]}."]}
    except TypeError as error:
        return "", {"payload": [f"The payload is not JSON: {error}"]}
    if text.isascii():
        size = len(text)
    else:
        try:
            size = len(text.encode())
        except UnicodeEncodeError:
            size = -1
    if size < 0 or ("\\u0000" in text and first_unstorable(payload)):
        path, reason = first_unstorable(payload) or ("payload", "is not valid Unicode")
        return "", {path: [f"The value {reason}."]}
    if size > limit:
        return "", {"payload": [f"The payload is {size} bytes; the limit is {limit} bytes."]}
    return text, {}
