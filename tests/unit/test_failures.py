"""Tracebacks kept with a failure (bounded, storable) and fingerprints of failures (no database)."""

from __future__ import annotations

import uuid

import pytest

from jobs.failures import (
    MAX_TRACEBACK_BYTES,
    bound_traceback,
    failure_fields,
    fingerprint,
    format_traceback,
    frame_from_text,
    innermost_frame,
    normalise_message,
    storable_text,
)


def _inner(message: str) -> None:
    raise ValueError(message)


def _outer(message: str) -> None:
    _inner(message)


def _raised(message: str = "bad value 42") -> ValueError:
    try:
        _outer(message)
    except ValueError as error:
        return error
    raise AssertionError("unreachable")


def _recurse(n: int) -> None:
    if n == 0:
        raise RuntimeError("bottom of the stack")
    _recurse(n - 1) if n % 2 else _recurse_again(n - 1)


def _recurse_again(n: int) -> None:
    _recurse(n)


def test_a_short_traceback_is_kept_whole():
    text = "Traceback (most recent call last):\n  ...\nValueError: x\n"
    assert bound_traceback(text) == text


@pytest.mark.parametrize("char", ["a", "é", "€", "😀"])
def test_a_long_traceback_keeps_head_and_tail_within_the_limit(char):
    text = "HEAD-START\n" + char * 40_000 + "\nValueError: the end\n"
    bounded = bound_traceback(text)
    assert len(bounded.encode()) <= MAX_TRACEBACK_BYTES
    assert bounded.startswith("HEAD-START\n")
    assert bounded.endswith("\nValueError: the end\n")
    assert "bytes of traceback omitted" in bounded
    # The count in the marker is what was left out, to the byte.
    omitted = int(bounded.split("[… ", 1)[1].split(" bytes", 1)[0])
    marker = f"\n[… {omitted} bytes of traceback omitted …]\n"
    assert len(bounded.encode()) - len(marker.encode()) + omitted == len(text.encode())


def test_a_bound_never_splits_a_character():
    text = "€" * 10_000  # three bytes each: no cut may fall inside one
    bounded = bound_traceback(text, limit=1000, head=301)
    assert len(bounded.encode()) <= 1000
    assert set(bounded.split("\n[…", 1)[0]) == {"€"}


def test_unstorable_text_is_escaped_not_refused():
    assert storable_text("a\x00b") == "a\\x00b"
    assert storable_text("lone \ud800 surrogate") == "lone \\ud800 surrogate"
    assert storable_text("plain é") == "plain é"


def test_the_formatted_traceback_names_every_frame_and_the_error():
    text = format_traceback(_raised())
    assert "_outer" in text and "_inner" in text
    assert text.rstrip().endswith("ValueError: bad value 42")


def test_a_deep_traceback_is_bounded_and_ends_with_the_error():
    try:
        _recurse(400)
    except RuntimeError as error:
        text = format_traceback(error)
    assert len(text.encode()) <= MAX_TRACEBACK_BYTES
    assert "omitted" in text and text.rstrip().endswith("RuntimeError: bottom of the stack")


def test_a_chained_error_prints_its_cause_first():
    try:
        try:
            _outer("first")
        except ValueError as cause:
            raise KeyError("second") from cause
    except KeyError as error:
        text = format_traceback(error)
        frame = innermost_frame(error)
    assert text.index("ValueError: first") < text.index("KeyError: 'second'")
    # The frame that raised the error itself, not its cause.
    assert frame == "test_failures.py:test_a_chained_error_prints_its_cause_first"
    assert frame_from_text(text) == frame


def test_the_innermost_frame_is_the_raising_function():
    error = _raised()
    assert innermost_frame(error) == "test_failures.py:_inner"
    assert frame_from_text(format_traceback(error)) == "test_failures.py:_inner"
    assert innermost_frame(ValueError("never raised")) == ""
    assert frame_from_text("no frames here") == ""


def test_frames_are_read_from_a_remote_traceback_and_an_exception_group():
    remote = (
        "Traceback (most recent call last):\n"
        '  File "/home/w/app/main.py", line 3, in <module>\n'
        '  File "/opt/venv/lib/site/resize.py", line 88, in shrink\n'
        "    raise OSError(5)\n"
        "OSError: 5\n"
    )
    assert frame_from_text(remote) == "resize.py:shrink"
    group = (
        "  + Exception Group Traceback (most recent call last):\n"
        '  |   File "/app/run.py", line 1, in main\n'
        "  | ExceptionGroup: two (2 sub-exceptions)\n"
        "  +-+---------------- 1 ----------------\n"
        "    | Traceback (most recent call last):\n"
        '    |   File "/app/tasks.py", line 9, in fetch\n'
        "    | TimeoutError: slow\n"
    )
    assert frame_from_text(group) == "tasks.py:fetch"


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("order 17 not found", "order 4242 not found"),
        (f"job {uuid.uuid4()} is gone", f"job {uuid.uuid4()} is gone"),
        (f"job {uuid.uuid4().hex} is gone", f"job {uuid.uuid4().hex} is gone"),
        ("object at 0x7f3a2b1c0d90", "object at 0x7f3a2b1c1e00"),
        ("sha deadbeef01 mismatch", "sha 0123abcdef mismatch"),
        ("took 1.5 s", "took 12.25 s"),
        ("spaces  \t here\n", "spaces here"),
    ],
)
def test_variable_parts_of_a_message_do_not_change_its_fingerprint(a, b):
    assert normalise_message(a) == normalise_message(b)
    assert fingerprint("E", a, "ops.py:run") == fingerprint("E", b, "ops.py:run")


def test_class_words_and_frame_each_change_the_fingerprint():
    base = fingerprint("ValueError", "disk full", "ops.py:write")
    assert len(base) == 12 and int(base, 16) >= 0
    assert fingerprint("ValueError", "disk full", "ops.py:write") == base
    assert fingerprint("OSError", "disk full", "ops.py:write") != base
    assert fingerprint("ValueError", "disk gone", "ops.py:write") != base
    assert fingerprint("ValueError", "disk full", "ops.py:flush") != base
    assert fingerprint("ValueError", "disk full") != base


def test_failure_fields_bound_the_traceback_and_read_its_frame():
    error = _raised("bad value 1")
    fields = failure_fields("ValueError", "bad value 1", traceback="x" * 50_000 + "\x00")
    assert len(fields["traceback"].encode()) <= MAX_TRACEBACK_BYTES
    assert "\x00" not in fields["traceback"]
    assert fields["fingerprint"] == fingerprint("ValueError", "bad value 1")
    text = format_traceback(error)
    from_text = failure_fields("ValueError", "bad value 1", traceback=text)
    from_error = failure_fields(
        "ValueError", "bad value 1", traceback=text, frame=innermost_frame(error)
    )
    assert from_text == from_error
    assert from_text["fingerprint"] == fingerprint(
        "ValueError", "bad value 9", "test_failures.py:_inner"
    )
    assert "traceback" not in failure_fields("JobExpired", "The job expired.")
