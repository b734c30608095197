"""Results and events no database can store fail their own job, never a whole batch.

Successes are written in batches; a NUL in one result once made PostgreSQL
refuse the batch's statement, so every job in it stayed running.
"""

from __future__ import annotations

import pytest

from jobs.enqueue import JobSpec, enqueue_many
from jobs.models import Job

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_unstorable_result_fails_its_job_and_spares_its_batch(worker):
    specs = [JobSpec("ping", queue="results") for _ in range(6)] + [
        JobSpec("test.returns", {"kind": kind}, queue="results")
        for kind in ("nul", "nan", "emit_nul", "deep")
    ]
    jobs = enqueue_many(specs)
    proc = worker("results", args=("--concurrency", "8", "--burst"))
    assert proc.wait(timeout=60) == 0, proc.output()
    rows = {
        str(row["id"]): row
        for row in Job.objects.filter(pk__in=[j.pk for j in jobs]).values(
            "id", "status", "error_code", "error_message", "operation"
        )
    }
    pings = [r for r in rows.values() if r["operation"] == "ping"]
    assert [r["status"] for r in pings] == ["succeeded"] * 6
    nul, nan, emit_nul, deep = (rows[str(j.pk)] for j in jobs[6:])
    assert (nul["status"], nul["error_code"]) == ("failed", "ResultNotSerializable")
    assert "NUL" in nul["error_message"] and "result.text" in nul["error_message"]
    assert (nan["status"], nan["error_code"]) == ("failed", "ResultNotSerializable")
    assert emit_nul["status"] == "failed" and emit_nul["error_code"] == "UnstorableValue"
    assert "message contains a NUL" in emit_nul["error_message"]
    assert (deep["status"], deep["error_code"]) == ("failed", "ResultNotSerializable")
    assert "nested too deeply" in deep["error_message"]


def test_a_plain_result_is_stored_as_returned(worker):
    job = enqueue_many([JobSpec("test.returns", {"kind": "plain"}, queue="results-plain")])[0]
    proc = worker("results-plain", args=("--burst",))
    assert proc.wait(timeout=60) == 0, proc.output()
    stored = Job.objects.get(pk=job.pk)
    assert (stored.status, stored.result) == ("succeeded", {"ok": True})
