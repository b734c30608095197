"""GET /metrics after real workloads, parsed with prometheus_client.

Workers are real ``runworker --burst`` processes; the rollup runs as the
reaper runs it (``reaper --once``) or through ``roll_up_metrics``. Every
figure is checked exactly, so a counter that came from one process's memory,
counted an event twice, or lost one across processes would fail here.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from jobs.enqueue import enqueue
from jobs.metrics import buckets, rollup
from jobs.metrics.rollup import (
    Sums,
    prune_metric_rollups,
    read_batch,
    roll_up_metrics,
    write_batch,
)
from jobs.models import JobEvent, MetricCursor, MetricRollup, MetricTotal
from jobs.schedules.services import create_schedule
from jobs.selectors import job_events_after
from jobs.transitions import cancel_job, complete_job, fail_job
from tests.factories import (
    claim,
    failed,
    running,
    succeeded,
    unique_queue,
)
from tests.integration.api.conftest import assert_error_shape

from .conftest import METRICS_KNOBS, Api, make_user, scrape, value

pytestmark = pytest.mark.django_db(transaction=True)

COUNTERS = ("started", "succeeded", "failed", "retried", "cancelled")


def totals(samples, queue: str, operation: str) -> dict[str, float | None]:
    found = {
        name: value(samples, f"controlplane_jobs_{name}_total", queue=queue, operation=operation)
        for name in COUNTERS
    }
    for histogram in ("wait", "run"):
        name = f"controlplane_job_{histogram}_seconds_count"
        found[f"{histogram}_count"] = value(samples, name, queue=queue, operation=operation)
    return found


def workload(queue: str) -> None:
    """3 pings, a failure, a failure retried twice, a retry_later twice, a cancel, a later job."""
    for _ in range(3):
        enqueue("ping", {}, queue=queue)
    enqueue("fail", {"message": "boom"}, queue=queue)
    enqueue("fail", {"message": "flaky", "retryable": True}, queue=queue, max_attempts=3)
    enqueue("retry_later", {"times": 2, "delay": 0.05}, queue=queue, max_attempts=1)
    cancel_job(enqueue("ping", {}, queue=queue).pk, reason="not needed")
    enqueue("ping", {}, queue=queue, run_after=timezone.now() + timedelta(hours=1))


# (started, succeeded, failed, retried, cancelled, wait observations, run observations)
EXPECTED = {
    "ping": (3, 3, 0, 0, 1, 3, 3),
    "fail": (4, 0, 2, 2, 0, 4, 4),
    "retry_later": (3, 1, 0, 2, 0, 3, 3),
}


def expected(times: int = 1) -> dict[str, dict[str, float]]:
    keys = (*COUNTERS, "wait_count", "run_count")
    return {
        op: {k: float(v * times) for k, v in zip(keys, row, strict=True)}
        for op, row in EXPECTED.items()
    }


def test_a_known_workload_scrapes_exactly(api_for, drain, start_process):
    queue = unique_queue()
    workload(queue)
    drain(queue)
    reaper = start_process("reaper", "--once", env=METRICS_KNOBS)
    assert reaper.wait(timeout=60) == 0, reaper.output()
    assert "metric_events=" in reaper.output()

    samples = scrape(api_for("viewer"))
    for operation, figures in expected().items():
        assert totals(samples, queue, operation) == figures, operation
    jobs = {
        s: value(samples, "controlplane_jobs", queue=queue, status=s)
        for s in ("queued", "running", "succeeded", "failed", "cancelled")
    }
    assert jobs == {"queued": 1, "running": 0, "succeeded": 4, "failed": 2, "cancelled": 1}
    # The job for later is not waiting yet.
    assert value(samples, "controlplane_queue_oldest_queued_age_seconds", queue=queue) == 0
    assert value(samples, "controlplane_lease_expiries_total", queue=queue, operation="ping") == 0
    assert value(samples, "controlplane_reaper_rescues_total", queue=queue, operation="ping") == 0
    # Histograms are cumulative with +Inf equal to the count; the sums are seconds.
    for histogram in ("wait", "run"):
        name = f"controlplane_job_{histogram}_seconds"
        les = {
            dict(labels)["le"]: n
            for labels, n in samples[f"{name}_bucket"].items()
            if dict(labels)["queue"] == queue and dict(labels)["operation"] == "fail"
        }
        assert len(les) == len(buckets.BOUNDS) + 1
        assert les["+Inf"] == 4
        assert list(les.values()) == sorted(les.values())
        total = value(samples, f"{name}_sum", queue=queue, operation="fail")
        assert 0 < total < 60
    # Waits of the retried runs include their backoff (RETRY_BACKOFF_SECONDS 0.1 x jitter).
    wait_sum = value(samples, "controlplane_job_wait_seconds_sum", queue=queue, operation="fail")
    assert wait_sum >= 0.05 + 0.1
    # Each retry_later run ends before the next starts: three runs, none longer than the drain.
    assert value(samples, "controlplane_job_run_seconds_sum", queue=queue, operation="ping") < 30


def test_counters_hold_across_worker_processes_and_restarts(api_for, drain):
    """Counters come from the database: one worker, then two new ones at once, add up exactly."""
    queue = unique_queue()
    workload(queue)
    drain(queue)  # worker process 1 (and more if retries came due after it left)
    roll_up_metrics(settle_seconds=0)
    viewer = api_for("viewer")
    first = scrape(viewer)
    for operation, figures in expected(1).items():
        assert totals(first, queue, operation) == figures, operation

    workload(queue)
    drain(queue, processes=2)  # two new processes at once: the first ones are long gone
    roll_up_metrics(settle_seconds=0)
    second = scrape(viewer)
    for operation, figures in expected(2).items():
        assert totals(second, queue, operation) == figures, operation
    # Another scrape counts nothing again (no per-scrape or per-process state).
    third = scrape(viewer)
    for operation, figures in expected(2).items():
        assert totals(third, queue, operation) == figures, operation


def test_rollup_is_idempotent_and_counts_once_with_competing_reapers():
    queue = unique_queue()
    for _ in range(4):
        succeeded(queue=queue)
    failed(queue=queue)
    # Run twice: the second reads nothing new.
    first = roll_up_metrics(settle_seconds=0)
    assert first.events == 4 * 2 + 2 and first.caught_up
    again = roll_up_metrics(settle_seconds=0)
    assert again.events == 0 and again.caught_up
    total = MetricTotal.objects.get(queue=queue, operation="ping")
    assert (total.started, total.succeeded, total.failed) == (5, 4, 1)
    assert sum(total.run_bucket_counts) == 5 and sum(total.wait_bucket_counts) == 5

    # Two reapers read the same range: the first write wins, the second writes nothing.
    for _ in range(3):
        succeeded(queue=queue)
    after = MetricCursor.objects.get(name="events").last_event_id
    cutoff = timezone.now()
    one, two = read_batch(after, cutoff), read_batch(after, cutoff)
    assert one is not None and two is not None and one.events == two.events == 6
    assert write_batch(one, cutoff) is True
    assert write_batch(two, cutoff) is False
    total.refresh_from_db()
    assert (total.started, total.succeeded) == (8, 7)
    assert MetricCursor.objects.get(name="events").last_event_id == one.upto


def test_concurrent_rollups_in_threads_count_every_event_once():
    queue = unique_queue()
    for _ in range(30):
        succeeded(queue=queue)
    results, errors = [], []

    def reaper() -> None:
        try:
            for _ in range(50):
                result = roll_up_metrics(settle_seconds=0, batch_ids=7)
                results.append(result)
                if result.caught_up:
                    break
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=reaper) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    roll_up_metrics(settle_seconds=0)
    total = MetricTotal.objects.get(queue=queue, operation="ping")
    assert (total.started, total.succeeded) == (30, 30)
    assert sum(r.events for r in results) == 60
    minutes = MetricRollup.objects.filter(queue=queue, operation="ping")
    assert sum(m.succeeded for m in minutes) == 30
    assert MetricCursor.objects.get(name="events").last_event_id == JobEvent.objects.latest("id").id


def _retry_then_succeed(job, held) -> None:
    """Fail the run with a 0.1 s backoff, run it again 0.05 s after it is due, and succeed."""
    fail_job(
        job.pk,
        lease_token=held.lease_token,
        error_code="Flaky",
        error_message="again",
        retryable=True,
        backoff_seconds=0.1,
    )
    time.sleep(0.15)  # the subject: a wait counted from when the retry came due, not from 0
    again = claim(job)  # run_after and started_at now belong to the second run
    complete_job(job.pk, lease_token=again.lease_token, result=None)


def _true_waits_and_runs(job) -> tuple[float, float]:
    """What the timeline says: the sums of the job's two waits and two runs, in seconds."""
    events = job_events_after(job.pk)  # the implied job.enqueued included (jobs.timeline)
    ts = {e.event: e.ts for e in events if e.event != "job.started"}
    starts = [e.ts for e in events if e.event == "job.started"]
    retry = next(e for e in events if e.event == "job.retry_scheduled")
    job.refresh_from_db()  # run_after: when the retry came due (the claim leaves it)
    waits = [starts[0] - ts["job.enqueued"], starts[1] - job.run_after]
    runs = [retry.ts - starts[0], ts["job.succeeded"] - starts[1]]
    assert timedelta(seconds=0.04) < waits[1] < timedelta(seconds=5)  # from due, not failure
    return sum(w.total_seconds() for w in waits), sum(r.total_seconds() for r in runs)


def test_waits_and_runs_of_jobs_requeued_before_the_rollup_come_from_their_events():
    """The job row only remembers its latest run: earlier ones are read from the timeline,
    whether the earlier start was in the same rollup batch or in one before it."""
    queue = unique_queue()
    one, held_one = running(queue=queue, max_attempts=2)
    two, held_two = running(queue=queue, max_attempts=2)
    _retry_then_succeed(one, held_one)  # all of it in the next rollup
    roll_up_metrics(settle_seconds=0)  # two's first start is rolled up on its own
    _retry_then_succeed(two, held_two)
    roll_up_metrics(settle_seconds=0)

    total = MetricTotal.objects.get(queue=queue, operation="ping")
    assert (total.started, total.retried, total.succeeded) == (4, 2, 2)
    assert sum(total.wait_bucket_counts) == 4 and sum(total.run_bucket_counts) == 4
    waits, runs = zip(_true_waits_and_runs(one), _true_waits_and_runs(two), strict=True)
    assert total.wait_sum == pytest.approx(sum(waits), abs=1e-3)
    assert total.run_sum == pytest.approx(sum(runs), abs=1e-3)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL sums in SQL")
def test_the_databases_sums_equal_the_row_by_row_sums(drain):
    """On PostgreSQL the batch is summed in SQL; SQLite reads it row by row. Both must
    place every event in the same minute, counter and histogram slot, durations that
    fall exactly on a bucket bound (Prometheus ``le``) and past the last one included."""
    queue = unique_queue()
    workload(queue)
    drain(queue)
    queue = unique_queue()  # the later job of the workload stays queued there
    for ms in (0, 5, 10, 7, 2500, 4_000_000):
        job, held = running(queue=queue)
        complete_job(job.pk, lease_token=held.lease_token, event_fields={"duration_ms": ms})
    job, held = running(queue=queue)
    complete_job(job.pk, lease_token=held.lease_token)  # no duration: from its start
    _retry_then_succeed(*running(queue=queue, max_attempts=2))
    cancel_job(running(queue=queue)[0].pk, reason="stop")
    after = 0  # every event of the test
    in_sql = read_batch(after, timezone.now())
    assert in_sql is not None
    by_rows = rollup.Batch(after=after, upto=in_sql.upto)
    rollup._sum_in_python(by_rows)
    assert in_sql.events == by_rows.events > 20
    assert in_sql.sums.keys() == by_rows.sums.keys()
    for key, sums in in_sql.sums.items():
        other = by_rows.sums[key]
        assert sums.wait_counts == other.wait_counts and sums.run_counts == other.run_counts
        for name in (*rollup.COUNTERS,):
            assert getattr(sums, name) == getattr(other, name), name
        assert sums.wait_sum == pytest.approx(other.wait_sum, abs=1e-6)
        assert sums.run_sum == pytest.approx(other.run_sum, abs=1e-6)
    total = Sums()
    for sums in in_sql.sums.values():
        total = total.merged(sums)
    assert total.run_counts[0] >= 2 and total.run_counts[1] >= 2  # 0 and 5 ms; 7 and 10 ms
    assert total.run_counts[-1] == 1  # past the last bound


def test_retention_prunes_minutes_but_never_the_counters(api_for):
    queue = unique_queue()
    succeeded(queue=queue)
    roll_up_metrics(settle_seconds=0)
    assert MetricRollup.objects.filter(queue=queue).count() == 1
    assert prune_metric_rollups(now=timezone.now() + timedelta(days=29)) == 0
    assert prune_metric_rollups(now=timezone.now() + timedelta(days=31)) == 1
    assert not MetricRollup.objects.filter(queue=queue).exists()
    samples = scrape(api_for("viewer"))
    assert value(samples, "controlplane_jobs_succeeded_total", queue=queue, operation="ping") == 1


def test_lease_expiries_and_rescues_are_counted(api_for, start_process):
    """A run whose lease ran out is rescued by the reaper: one lease expiry, one rescue."""
    queue = unique_queue()
    running(queue=queue, lease_seconds=0.01)
    reaper = start_process("reaper", "--once", env=METRICS_KNOBS)
    assert reaper.wait(timeout=60) == 0, reaper.output()
    roll_up_metrics(settle_seconds=0)  # the reaper rolls up before or after its rescue
    samples = scrape(api_for("viewer"))
    labels = {"queue": queue, "operation": "ping"}
    assert value(samples, "controlplane_lease_expiries_total", **labels) == 1
    assert value(samples, "controlplane_reaper_rescues_total", **labels) == 1
    assert value(samples, "controlplane_jobs_started_total", **labels) == 1
    assert value(samples, "controlplane_jobs", queue=queue, status="queued") == 1


def test_live_gauges(api_for, burst, settings):
    # Oldest ready job: ready 30 s ago; a job for later does not count.
    queue = unique_queue()
    enqueue("ping", {}, queue=queue, run_after=timezone.now() - timedelta(seconds=30))
    enqueue("ping", {}, queue=queue, run_after=timezone.now() + timedelta(hours=1))
    # A remote worker serving ping (queue default) is alive: a local operation, which
    # remote workers serve only with REMOTE_MAY_SERVE_LOCAL.
    settings.CONTROLPLANE = {**(settings.CONTROLPLANE or {}), "REMOTE_MAY_SERVE_LOCAL": True}
    remote = api_for("remote")
    assert remote.post("/workers", {"name": "w", "operations": ["ping"]}).status_code == 201
    # A schedule made 30 s ago (its first slot is overdue: no reaper fired it) and one not due.
    ago = timezone.now() - timedelta(seconds=30)
    create_schedule({"name": "often", "operation": "ping", "every_seconds": 1}, now=ago)
    create_schedule({"name": "hourly", "operation": "ping", "every_seconds": 3600})
    # A fan-out whose batches nobody consumes: four messages wait on <queue>.batch.
    fan = unique_queue()
    enqueue("fanout", {"batches": 4}, queue=fan)
    burst(fan)
    samples = scrape(api_for("viewer"))
    age = value(samples, "controlplane_queue_oldest_queued_age_seconds", queue=queue)
    assert 29 < age < 90
    assert value(samples, "controlplane_workers_alive", queue="default") == 1
    assert value(samples, "controlplane_workers_alive", queue=queue) == 0
    assert 28 < value(samples, "controlplane_schedule_lag_seconds", schedule="often") < 90
    assert value(samples, "controlplane_schedule_lag_seconds", schedule="hourly") == 0
    messages = {
        state: value(samples, "controlplane_batch_messages", queue=f"{fan}.batch", state=state)
        for state in ("waiting", "in_flight", "dead")
    }
    assert messages == {"waiting": 4, "in_flight": 0, "dead": 0}
    assert value(samples, "controlplane_jobs", queue=fan, status="running") == 1


def test_counts_past_the_cap_are_estimates_not_scans(api_for, settings):
    settings.CONTROLPLANE = {"COUNT_CAP": 5}
    queue = unique_queue()
    for _ in range(8):
        enqueue("ping", {}, queue=queue)
    samples = scrape(api_for("viewer"))
    queued = value(samples, "controlplane_jobs", queue=queue, status="queued")
    if connection.vendor == "postgresql":
        assert queued >= 5  # the planner's estimate, never below what was counted
    else:
        assert queued == 8
    assert value(samples, "controlplane_jobs", queue=queue, status="failed") == 0


# --- authentication --------------------------------------------------------------


def test_scrapers_need_view_permission_or_the_metrics_token(api_for, settings):
    assert_error_shape(api_for("anonymous").get("/metrics"), 401)
    assert_error_shape(api_for("remote").get("/metrics"), 403)  # no view_job
    enqueue("ping", {}, queue=unique_queue())
    assert scrape(api_for("viewer")) and scrape(api_for("admin"))  # each asserts a 200
    # A signed-in dashboard user with the permission.
    browser = Client()
    browser.force_login(make_user("watcher", ["view_job"]))
    assert browser.get("/metrics/").status_code == 200

    anonymous = Api()
    # No METRICS_TOKEN configured: a bearer token is refused, not ignored.
    assert_error_shape(
        anonymous.client.get("/metrics", headers={"Authorization": "Bearer anything"}), 401
    )
    settings.CONTROLPLANE = {"METRICS_TOKEN": "s3cret-for-prometheus"}
    assert scrape(anonymous, Authorization="Bearer s3cret-for-prometheus")
    wrong = anonymous.client.get("/metrics", headers={"Authorization": "Bearer s3cret"})
    assert_error_shape(wrong, 401)
    assert wrong["WWW-Authenticate"]
    # Unknown query parameters are refused like everywhere in the API.
    assert_error_shape(api_for("viewer").get("/metrics", foo="1"), 400)


# --- JSON logs -----------------------------------------------------------------------


def test_json_logs_have_one_line_per_state_change(burst):
    queue = unique_queue()
    ok = enqueue("ping", {}, queue=queue)
    bad = enqueue("fail", {"message": "boom"}, queue=queue)
    (output,) = burst(queue, env={"CONTROLPLANE_LOG_FORMAT": "json"})
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert lines and all({"ts", "level", "logger", "message"} <= set(line) for line in lines)
    by_job: dict[str, list[dict]] = {}
    for line in lines:
        if "job_id" in line:
            by_job.setdefault(line["job_id"], []).append(line)
    assert [line["event"] for line in by_job[str(ok.pk)]] == ["job.claimed", "job.succeeded"]
    assert [line["event"] for line in by_job[str(bad.pk)]] == ["job.claimed", "job.failed"]
    success = by_job[str(ok.pk)][1]
    assert success["operation"] == "ping" and success["queue"] == queue
    assert success["attempt"] == 1 and isinstance(success["duration_ms"], int)
    failure = by_job[str(bad.pk)][1]
    assert failure["error_code"] == "DiagnosticFailure" and failure["error"] == "boom"
    assert failure["level"] == "warning" and failure["status"] == "failed"
    claimed = by_job[str(bad.pk)][0]
    assert claimed["operation"] == "fail" and claimed["attempt"] == 1
