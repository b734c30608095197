"""Payload-schema regexes on RE2, compiled once.

Schema regexes run on RE2, whose matching time is linear in the text:
``^(a+)+$`` against "aaa…a!" answers at once instead of backtracking for
minutes with the whole web process waiting behind it. ``schema_problem``
compiles every pattern of a schema here (``pattern_problem``) when it
registers; the validator (``jobs.schema_validator``) matches with the same
cache. Imported only where a schema has a pattern: most have none.
"""

from __future__ import annotations

import functools
from typing import Any

import re2

__all__ = ["compiled_pattern", "pattern_matches", "pattern_problem"]

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a refused pattern is the client's error, not a log line
_RE2_OPTIONS.max_mem = 2 << 20  # a compiled pattern's budget; larger ones are refused


@functools.lru_cache(maxsize=512)
def compiled_pattern(pattern: str) -> Any:
    """``pattern`` compiled by RE2 (``re2.error`` if RE2 cannot run it), cached."""
    return re2.compile(pattern, _RE2_OPTIONS)


def pattern_matches(pattern: str, text: str) -> bool:
    """Whether ``pattern`` matches somewhere in ``text`` (JSON Schema's ``pattern`` semantics).

    Text that is not valid Unicode (a lone surrogate) matches nothing: no
    database stores it, and enqueue refuses it before any schema is checked.
    """
    try:
        return compiled_pattern(pattern).search(text) is not None
    except UnicodeEncodeError:
        return False


def pattern_problem(pattern: str) -> str | None:
    """Why RE2 cannot run ``pattern``, as a sentence saying what to change; or None."""
    try:
        compiled_pattern(pattern)
    except re2.error as error:
        reason = error.args[0] if error.args else error
        if isinstance(reason, bytes):
            reason = reason.decode(errors="replace")
        shown = pattern if len(pattern) <= 100 else f"{pattern[:97]}..."
        return (
            f"The pattern {shown!r} is not a regular expression RE2 can "
            f"run ({reason}). Schema patterns run on RE2, which has no backreferences "
            "or lookaround and refuses very large repetitions; rewrite it without them."
        )
    return None
