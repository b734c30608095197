"""Per-queue rate limits: two real ``runworker`` processes share one queue's bucket.

The claims themselves are also driven in-process (the bucket in the
database, tokens returned when the queue runs dry, a cap beside the rate),
and ``CONTROLPLANE["QUEUES"]`` is applied by the workers when they start.
On PostgreSQL and SQLite.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from jobs.enqueue import JobSpec, enqueue, enqueue_many
from jobs.models import Job, JobEvent, OperatorAction, Queue, Worker
from jobs.queue_limits import apply_configured_queues
from jobs.rate_limits import claim_rate_limited
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

RATE = 5.0
WINDOW_SECONDS = 10.0
# The window opens once the start-up burst (a full bucket: max(1, rate) jobs) has started.
BURST = max(1, int(RATE))


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def starts_between(queue: str, start, end) -> list[dict]:
    return list(
        JobEvent.objects.filter(
            event="job.started", job__queue=queue, ts__gte=start, ts__lt=end
        ).values_list("fields", flat=True)
    )


def test_two_workers_start_the_rate_within_ten_percent_over_ten_seconds(worker):
    queue = f"limited-{uuid.uuid4().hex[:6]}"
    enqueue_many([JobSpec("ping", queue=queue) for _ in range(60)])
    # The limit comes from settings: each worker applies it before its first claim.
    env = {"CONTROLPLANE_QUEUES": json.dumps({queue: {"rate_limit_per_second": RATE}})}
    procs = [worker(queue, args=("--concurrency", "4"), env=env) for _ in range(2)]
    wait_for(
        lambda: JobEvent.objects.filter(event="job.started", job__queue=queue).exists(),
        timeout=30,
        message="the first start",
    )
    assert Queue.objects.get(name=queue).rate_limit_per_second == RATE

    # Keep the backlog growing at twice the rate: every enqueue is a NOTIFY on
    # PostgreSQL, which must not turn into a claim per wake-up.
    stop = threading.Event()
    errors: list[BaseException] = []

    def feed() -> None:
        try:
            while not stop.is_set():
                enqueue("ping", queue=queue)
                stop.wait(0.1)
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)
        finally:
            connection.close()

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        wait_for(
            lambda: JobEvent.objects.filter(event="job.started", job__queue=queue).count() >= BURST,
            timeout=30,
            message="the start-up burst",
        )
        cpu_before = [cpu_seconds(p.pid) for p in procs]
        window_start = timezone.now()
        time.sleep(WINDOW_SECONDS)
        window_end = timezone.now()
        cpu_used = [
            cpu_seconds(p.pid) - before for p, before in zip(procs, cpu_before, strict=True)
        ]
    finally:
        stop.set()
        feeder.join(timeout=10)
    assert not errors, errors
    for proc in procs:
        assert proc.popen.poll() is None, proc.output()

    started = starts_between(queue, window_start, window_end)
    expected = RATE * (window_end - window_start).total_seconds()
    assert abs(len(started) - expected) <= 0.1 * expected, (len(started), expected)
    # The backlog never ran out: the bucket, not the work, set the pace.
    assert Job.objects.filter(queue=queue, status="queued").count() > 10
    # Both workers took part: the limit is the queue's, not each worker's.
    by_worker = {fields["worker"] for fields in started}
    assert len(by_worker) == 2, by_worker
    # Waiting for the next token, not polling for it: a busy loop would burn
    # the whole window; serving 5 jobs a second costs a few percent of it.
    assert max(cpu_used) < 0.15 * WINDOW_SECONDS, cpu_used


# --- the claim, in-process -------------------------------------------------------------


def claim(queue: str, limit: int, **kwargs):
    return claim_rate_limited(
        queue=queue, worker_id=uuid.uuid4(), limit=limit, lease_seconds=30, **kwargs
    )


def bucket(queue: str) -> tuple[float, object]:
    return Queue.objects.values_list("rate_tokens", "rate_refilled_at").get(name=queue)


def test_a_full_bucket_grants_one_second_of_jobs_then_says_when_the_next_token_is_due():
    Queue.objects.create(name="q", rate_limit_per_second=4)
    enqueue_many([JobSpec("ping", queue="q") for _ in range(10)])
    first = claim("q", 10)
    assert len(first.jobs) == 4  # the burst: max(1, rate)
    assert first.retry_in == pytest.approx(0.25, abs=0.05)
    assert 0.0 <= bucket("q")[0] < 0.5
    empty = claim("q", 10)
    assert empty.jobs == [] and 0 < empty.retry_in <= 0.25
    time.sleep(empty.retry_in + 0.02)
    assert len(claim("q", 10).jobs) == 1
    assert Job.objects.filter(queue="q", status="running").count() == 5


def test_tokens_a_claim_found_no_job_for_go_back():
    Queue.objects.create(name="q", rate_limit_per_second=10)
    enqueue_many([JobSpec("ping", queue="q") for _ in range(3)])
    result = claim("q", 8)
    assert len(result.jobs) == 3 and result.retry_in is None  # the queue ran dry, not the bucket
    assert 7.0 <= bucket("q")[0] < 8.0  # 10 - 3, plus what refilled meanwhile


def test_a_concurrency_cap_beside_the_rate_holds_and_costs_no_token():
    Queue.objects.create(name="q", rate_limit_per_second=10, concurrency_cap=2)
    enqueue_many([JobSpec("ping", queue="q") for _ in range(6)])
    result = claim("q", 6, cap=2)
    assert len(result.jobs) == 2 and result.retry_in is None
    tokens, stamp = bucket("q")
    assert tokens == 8.0  # 10 - 2
    assert claim("q", 6, cap=2).jobs == []
    # The capped claim took no token: only the refill between the two stamps (however slow
    # the machine), not a fixed window of wall time.
    later, later_stamp = bucket("q")
    assert later == pytest.approx(min(10.0, tokens + 10 * (later_stamp - stamp).total_seconds()))


def test_a_limit_cleared_meanwhile_claims_unlimited():
    Queue.objects.create(name="q", rate_limit_per_second=None)
    enqueue_many([JobSpec("ping", queue="q") for _ in range(5)])
    assert len(claim("q", 5).jobs) == 5


def test_a_stamp_from_a_clock_ahead_adds_no_tokens():
    later = timezone.now() + timedelta(seconds=30)
    Queue.objects.create(name="q", rate_limit_per_second=5, rate_tokens=0, rate_refilled_at=later)
    enqueue("ping", queue="q")
    result = claim("q", 1)
    assert result.jobs == [] and result.retry_in == pytest.approx(0.2)
    assert bucket("q")[1] == later


def test_concurrent_claimers_share_one_bucket():
    """Four threads claim at once from a full bucket of 6: together they get 6, not 24."""
    Queue.objects.create(name="q", rate_limit_per_second=6)
    enqueue_many([JobSpec("ping", queue="q") for _ in range(30)])
    got: list[int] = []
    barrier = threading.Barrier(4)

    def run() -> None:
        try:
            barrier.wait()
            got.append(len(claim("q", 10).jobs))
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sum(got) in (6, 7), got  # 7 if the claims spread over more than 1/6 s


# --- CONTROLPLANE["QUEUES"] ---------------------------------------------------------------


def test_settings_apply_when_they_change_and_an_operators_change_stands_until_then(settings):
    from jobs.operator_actions import set_rate_limit

    settings.CONTROLPLANE = {"QUEUES": {"emails": {"rate_limit_per_second": 5}}}
    assert apply_configured_queues() == ["emails"]
    queue = Queue.objects.get(name="emails")
    assert (queue.rate_limit_per_second, queue.concurrency_cap, queue.kind) == (5.0, None, "job")
    assert apply_configured_queues() == []  # a restart changes nothing

    set_rate_limit("emails", 2, user=None)  # an operator, from the dashboard or the API
    assert apply_configured_queues() == []
    assert Queue.objects.get(name="emails").rate_limit_per_second == 2.0

    settings.CONTROLPLANE = {
        "QUEUES": {"emails": {"rate_limit_per_second": 8, "concurrency_cap": 3}}
    }
    assert apply_configured_queues() == ["emails"]  # a deploy that changed the entry
    queue = Queue.objects.get(name="emails")
    assert (queue.rate_limit_per_second, queue.concurrency_cap) == (8.0, 3)
    applied = OperatorAction.objects.filter(action="queue_settings", target="emails")
    assert [a.filter for a in applied.order_by("id")] == [
        {"rate_limit_per_second": 5.0},
        {"rate_limit_per_second": 8.0, "concurrency_cap": 3},
    ]
    assert {a.username for a in applied} == {"settings"}


def test_a_malformed_queues_setting_stops_the_worker_before_it_registers(worker):
    proc = worker("q", env={"CONTROLPLANE_QUEUES": '{"q": {"rate_limit_per_second": 0}}'})
    assert proc.wait(timeout=30) != 0
    assert 'CONTROLPLANE["QUEUES"]["q"]: The rate limit must be' in proc.output()
    assert not Worker.objects.exists() and not Queue.objects.exists()
