"""Benchmark: what job-log capture costs a worker, per job and per record.

    .venv/bin/python bench/job_logs.py [--jobs 200000] [--records 100000] [--runs 5]

No database and no worker process: the parts of ``workers.log_capture`` a job's
thread runs, timed in this process with capture installed.

- **Per job that logs nothing**: ``begin`` + ``flush`` + ``end`` around an empty run,
  the whole cost capture adds to a job (a context variable set and reset, two
  dictionary lookups), against the same loop without them.
- **Per record**: ``logger.info`` and ``print`` in a job's thread, into the job's
  buffer (the database write happens later on the flusher thread, which is not
  started here), against the same call with no job running (the record passes by).
- **Past the bounds**: the same per record once the job's log is truncated (counted only).

The drain throughput with capture on and off is measured by ``bench/engine.py``
(``CONTROLPLANE_JOB_LOG_CAPTURE=false`` in its environment turns capture off in its
workers); see bench/README.md, "Job-log capture".
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    os.environ["CONTROLPLANE_JOB_LOG_MAX_RECORDS"] = str(args.records * 2)
    os.environ["CONTROLPLANE_JOB_LOG_MAX_BYTES"] = str(args.records * 100)
    import django

    django.setup()
    from jobs.claims import ClaimedJob
    from workers import log_capture

    log_capture._start_flusher = lambda: None  # type: ignore[assignment] - no writes here
    real_stdout = sys.stdout
    sys.stdout = io.StringIO()  # what install wraps: the echo lands here, not on the terminal
    log_capture.install()
    logging.getLogger().handlers = [log_capture._Capture.handler]  # type: ignore[list-item]
    log_capture._Capture.echo = False
    logger = logging.getLogger("bench.ops")

    def job() -> ClaimedJob:
        return ClaimedJob(uuid.uuid4(), "op", "q", {}, 1, 1, None, uuid.uuid4(), False)

    held = job()

    def per_job(capture: bool) -> float:
        started = time.perf_counter()
        for _ in range(args.jobs):
            if capture:
                token = log_capture.begin(held)
                log_capture.flush(held)
                log_capture.end(held, token)
        return (time.perf_counter() - started) / args.jobs * 1e9

    def per_record(kind: str, in_job: bool) -> float:
        target = job()
        token = log_capture.begin(target) if in_job else None
        started = time.perf_counter()
        if kind == "logging":
            for number in range(args.records):
                logger.info("record %d", number)
        else:
            for number in range(args.records):
                print("line", number)
        elapsed = time.perf_counter() - started
        if token is not None:
            log_capture._current.reset(token)
            log_capture._buffers.pop(target.id, None)
        return elapsed / args.records * 1e9

    def truncated_record() -> float:
        target = job()
        token = log_capture.begin(target)
        log_capture._buffer(target).budget.dropped_records = 1  # cut already
        started = time.perf_counter()
        for number in range(args.records):
            logger.info("record %d", number)
        elapsed = time.perf_counter() - started
        log_capture._current.reset(token)
        log_capture._buffers.pop(target.id, None)
        return elapsed / args.records * 1e9

    rows: dict[str, list[float]] = {}
    for _ in range(args.runs):
        measured = {
            "empty loop, per job (ns)": per_job(False),
            "capture around a job that logs nothing, per job (ns)": per_job(True),
            "logger.info, no job running (ns)": per_record("logging", False),
            "logger.info in a job, captured (ns)": per_record("logging", True),
            "logger.info in a job past its bounds (ns)": truncated_record(),
            "print, no job running (ns)": per_record("print", False),
            "print in a job, captured (ns)": per_record("print", True),
        }
        for name, value in measured.items():
            rows.setdefault(name, []).append(value)
    sys.stdout = real_stdout
    print(f"{args.jobs:,} jobs, {args.records:,} records, median of {args.runs} runs")
    for name, values in rows.items():
        print(f"  {name:<55} {statistics.median(values):>9,.0f}")


if __name__ == "__main__":
    main()
