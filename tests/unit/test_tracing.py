"""Tracing without the database: stored carriers are read defensively, and the remote
client works with no OpenTelemetry installed at all."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from jobs.tracing import MAX_CARRIER_ITEMS, carrier_of

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize(
    "stored",
    [
        None,
        {},
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ["traceparent", PARENT],
        {"traceparent": 1},
        {f"k{i}": "v" for i in range(MAX_CARRIER_ITEMS + 1)},
        {"traceparent": PARENT, "tracestate": "x" * 10_000},
    ],
)
def test_anything_but_a_small_mapping_of_strings_is_no_carrier(stored):
    assert carrier_of(stored) is None


def test_a_carrier_keeps_its_string_entries():
    assert carrier_of({"traceparent": PARENT, "tracestate": "a=1", "junk": 3}) == {
        "traceparent": PARENT,
        "tracestate": "a=1",
    }


def test_the_client_runs_jobs_without_opentelemetry_installed():
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["opentelemetry"] = None  # as if it were not installed
        from controlplane_client import ClaimedJob, Deferred
        from controlplane_client import serving  # noqa: F401 - imports without it
        from controlplane_client.tracing import run_traced

        job = ClaimedJob(id="j", operation="op", queue="q", payload={{}}, attempt=1,
                         max_attempts=1, lease_token="t",
                         trace_context={{"traceparent": "{PARENT}"}})
        assert run_traced(job, lambda j: {{"ok": j.id}}) == {{"ok": "j"}}
        try:
            run_traced(job, lambda j: 1 / 0)
        except ZeroDivisionError:
            print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
