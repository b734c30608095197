"""The pure parts of metrics and JSON logs: histogram buckets and log-line parsing."""

from __future__ import annotations

import json
import logging

from jobs.logging_json import JsonFormatter, parse_line
from jobs.metrics import buckets


def test_observations_fall_in_the_first_bucket_they_do_not_exceed():
    assert buckets.slot(0) == 0
    assert buckets.slot(0.005) == 0  # le is inclusive
    assert buckets.slot(0.0051) == 1
    assert buckets.slot(3600) == len(buckets.BOUNDS) - 1
    assert buckets.slot(3600.1) == len(buckets.BOUNDS)  # +Inf


def test_bucket_arrays_add_and_expose_cumulatively():
    a = buckets.empty()
    a[0], a[-1] = 2, 1
    total = buckets.added(a, [0, 3])  # a short (older) array counts as zeros past its end
    assert total[:2] == [2, 3] and total[-1] == 1 and len(total) == buckets.SLOTS
    exposed = buckets.cumulative(total)
    assert exposed[0] == ("0.005", 2) and exposed[1] == ("0.01", 5)
    assert exposed[-1] == ("+Inf", 6)


def test_log_lines_become_fields():
    event, fields = parse_line("job.requeued job_id=abc reason=shutdown attempt=2 took=1.5")
    assert event == "job.requeued"
    assert fields == {"job_id": "abc", "reason": "shutdown", "attempt": 2, "took": 1.5}
    _, quoted = parse_line("job.failed job_id=x error=Boom message='it broke: \\'x\\' y'")
    assert quoted["message_text"] == "it broke: 'x' y" and quoted["error"] == "Boom"
    assert parse_line("Worker started on two queues") == ("", {})


def test_the_formatter_writes_one_json_object_with_the_record_fields():
    record = logging.LogRecord("workers", logging.INFO, __file__, 1, "job.%s job_id=%s", None, None)
    record.args = ("succeeded", "j1")
    record.controlplane = {"job_id": "j1", "attempt": 1, "duration_ms": 7, "event": "ignored"}
    line = JsonFormatter().format(record)
    assert "\n" not in line
    data = json.loads(line)
    assert data["event"] == "job.succeeded" and data["level"] == "info"
    assert data["job_id"] == "j1" and data["duration_ms"] == 7
    assert data["message"] == "job.succeeded job_id=j1" and data["ts"].endswith("+00:00")
