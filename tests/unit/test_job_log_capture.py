"""Job-log capture without a database: routing by thread, bounds, the truncation marker."""

from __future__ import annotations

import io
import logging
import threading
import uuid

import pytest

from jobs.claims import ClaimedJob
from jobs.events import JOB_LOG, JOB_LOG_TRUNCATED
from jobs.job_logs import (
    JobLogBudget,
    LogLimits,
    event_level,
    stored_message,
)
from workers import log_capture


def claimed() -> ClaimedJob:
    return ClaimedJob(
        id=uuid.uuid4(),
        operation="op",
        queue="default",
        payload={},
        attempt=1,
        max_attempts=1,
        parent_id=None,
        lease_token=uuid.uuid4(),
        expired=False,
    )


@pytest.fixture
def capture(monkeypatch, settings):
    """Routing as a worker has it, with no flusher (nothing is written) and tiny bounds."""
    settings.CONTROLPLANE = {
        "JOB_LOG_MAX_RECORDS": 5,
        "JOB_LOG_MAX_BYTES": 1000,
        "JOB_LOG_MAX_MESSAGE_CHARS": 60,
    }
    monkeypatch.setattr(log_capture, "_start_flusher", lambda: None)
    monkeypatch.setattr(log_capture._Capture, "level", logging.INFO)
    monkeypatch.setattr(log_capture._Capture, "echo", True)
    real = io.StringIO()
    monkeypatch.setattr(log_capture._Capture, "real_stderr", real)
    handler = log_capture.JobLogHandler(logging.INFO)
    monkeypatch.setattr(log_capture._Capture, "handler", handler)
    logger = logging.getLogger("tests.unit.ops")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    logger.propagate = False  # the test's records stay off the session's own handlers
    job = claimed()
    token = log_capture._current.set(job)
    yield job, logger, real
    log_capture._current.reset(token)
    logger.removeHandler(handler)
    logger.propagate = True
    log_capture._buffers.pop(job.id, None)


def pending(job: ClaimedJob) -> list[tuple]:
    return log_capture._buffers[job.id].pending


def test_levels_map_to_the_timeline_levels():
    assert [event_level(n) for n in (10, 20, 30, 40, 50)] == [
        "info",
        "info",
        "warning",
        "error",
        "error",
    ]


def test_a_budget_keeps_the_head_whole_and_counts_the_rest():
    budget = JobLogBudget(LogLimits(max_records=3, max_bytes=10, max_message_chars=5))
    assert [budget.take(4), budget.take(4), budget.take(4), budget.take(1)] == [
        True,
        True,
        False,
        False,  # it would fit, but the log has a hole before it: dropped too
    ]
    assert (budget.records, budget.bytes) == (2, 8)
    assert (budget.dropped_records, budget.dropped_bytes) == (2, 5)
    assert budget.truncated


def test_messages_are_storable_and_cut_with_a_marker():
    limits = LogLimits(max_message_chars=5)
    assert stored_message("a\x00b", limits) == "a\ufffdb"
    assert (
        stored_message("abcdefgh", limits) == "abcd… [truncated: 3 of 8 characters not stored] …h"
    )


def test_records_of_the_job_thread_are_captured_others_pass_by(capture):
    job, logger, real = capture
    logger.debug("below the level")
    logger.info("info %s", 1)
    logger.warning("careful")
    try:
        raise KeyError("k")
    except KeyError:
        logger.exception("oops")
    logging.getLogger("workers").info("the worker's own line")
    other = threading.Thread(target=lambda: logger.error("another thread"))
    other.start()
    other.join()
    got = [
        (levelno, message.splitlines()[0], name) for _, levelno, message, name, _ in pending(job)
    ]
    assert got == [
        (logging.INFO, "info 1", "tests.unit.ops"),
        (logging.WARNING, "careful", "tests.unit.ops"),
        (logging.ERROR, "oops", "tests.unit.ops"),
    ]
    assert "KeyError: 'k'" in pending(job)[2][2]


def test_prints_split_into_lines_and_other_threads_pass_through(capture):
    job, _, _ = capture
    real = io.StringIO()
    router = log_capture.StreamRouter(real, "stdout")
    router.write("one\ntw")
    router.write("o\n")
    router.write("three")
    done = threading.Thread(target=lambda: router.write("elsewhere\n"))
    done.start()
    done.join()
    assert [item[2] for item in pending(job)] == ["one", "two"]
    assert real.getvalue() == "one\ntwo\nthreeelsewhere\n"  # echo on: the worker's output too
    events = log_capture._buffers[job.id].take_pending(final=True)
    assert [e.message for e in events] == ["one", "two", "three"]
    assert events[0].fields == {"logger": "", "levelname": "INFO", "source": "stdout"}


def test_echo_off_keeps_a_job_s_prints_off_the_worker_s_output(capture, monkeypatch):
    job, _, _ = capture
    monkeypatch.setattr(log_capture._Capture, "echo", False)
    real = io.StringIO()
    router = log_capture.StreamRouter(real, "stderr")
    router.write("hidden\n")
    assert real.getvalue() == ""
    assert [(item[1], item[2]) for item in pending(job)] == [(logging.WARNING, "hidden")]


def test_past_the_bounds_one_marker_counts_what_was_dropped(capture):
    job, logger, _ = capture
    router = log_capture.StreamRouter(io.StringIO(), "stdout")
    router.write("y" * 100 + "z" * 15 + "\n")  # a long line: one record, cut with a marker
    router.write("w" * 150)  # a long unfinished line: records of the message cap
    for number in range(10):
        logger.info("line %d", number)
    router.write("z\n" * 1000)  # past the bounds: counted, not split into records
    buffer = log_capture._buffers[job.id]
    events = buffer.take_pending(final=True)
    assert [e.event for e in events] == [JOB_LOG] * 5 + [JOB_LOG_TRUNCATED]
    assert (
        events[0].message
        == "y" * 45 + "… [truncated: 55 of 115 characters not stored] …" + "z" * 15
    )
    assert [e.message for e in events[1:5]] == ["w" * 60, "w" * 60, "line 0", "line 1"]
    marker = events[-1]
    assert marker.fields["dropped_records"] == 8 + 1000 + 1  # the "w" tail at the end
    assert marker.fields["max_records"] == 5 and marker.level == "warning"
    assert buffer.take_pending(final=True) == []  # one marker per job


def test_a_job_that_logs_nothing_gets_no_buffer(capture):
    job, _, _ = capture
    log_capture.flush(job)
    assert job.id not in log_capture._buffers


def test_echo_off_keeps_captured_records_off_the_worker_s_handlers(capture):
    job, logger, _ = capture
    shown = io.StringIO()
    console = logging.StreamHandler(shown)
    console.addFilter(log_capture._NotCaptured())
    logger.addHandler(console)
    try:
        logger.info("captured only")
        elsewhere = threading.Thread(target=lambda: logger.info("outside a job"))
        elsewhere.start()
        elsewhere.join()
    finally:
        logger.removeHandler(console)
    assert shown.getvalue() == "outside a job\n"
    assert [item[2] for item in pending(job)] == ["captured only"]
