"""The worker's hot path: which jobs a local worker claims, the fused cycle, its log lines.

Real ``runworker`` processes and real statements, on PostgreSQL and SQLite
(``complete_and_claim`` is PostgreSQL only).
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from jobs.claims import Completion, claim_jobs, complete_and_claim, extend_leases
from jobs.enqueue import JobSpec, enqueue, enqueue_many
from jobs.independent import independent_connection
from jobs.models import Job, JobEvent, RemoteOperation
from tests.integration.timelines import timeline_of

pytestmark = pytest.mark.django_db(transaction=True)


def postgres_only(test):
    """complete_and_claim is one PostgreSQL statement; SQLite runs the two steps."""

    def run(*args, **kwargs):
        if connection.vendor != "postgresql":
            pytest.skip("complete_and_claim is PostgreSQL only")
        return test(*args, **kwargs)

    run.__name__ = test.__name__
    return run


def status(job: Job) -> str:
    return Job.objects.values_list("status", flat=True).get(pk=job.pk)


def timeline(job: Job) -> list[tuple[int, str]]:
    return timeline_of(job)


def declare_remote(name: str, queue: str = "default") -> None:
    """What a remote worker's registration leaves behind for an operation it declares."""
    RemoteOperation.objects.create(name=name, queue=queue, payload_schema={"type": "object"})


def test_a_remote_only_operation_stays_queued_and_an_unknown_one_still_fails(worker):
    declare_remote("remote.only")
    remote = enqueue("remote.only", {})
    unknown = Job.objects.create(operation="no.such.op", last_event_seq=0)
    local = enqueue("ping")
    proc = worker(args=("--burst", "--concurrency", "4"))
    assert proc.wait(timeout=60) == 0, proc.output()
    assert status(local) == "succeeded"
    unknown.refresh_from_db()
    assert (unknown.status, unknown.error_code) == ("failed", "UnknownOperation")
    assert status(remote) == "queued"
    assert timeline(remote) == [(1, "job.enqueued")]


def test_a_remote_operation_once_gone_is_claimed_and_fails_unknown(worker):
    declare_remote("remote.gone")
    job = enqueue("remote.gone", {})
    RemoteOperation.objects.filter(name="remote.gone").update(deleted=True)
    proc = worker(args=("--burst",))
    assert proc.wait(timeout=60) == 0, proc.output()
    job.refresh_from_db()
    assert (job.status, job.error_code) == ("failed", "UnknownOperation")


def test_claim_with_local_operations_skips_remote_only_ones_it_does_not_run():
    declare_remote("remote.only")
    declare_remote("both.sides")
    queue = f"q-{uuid.uuid4().hex[:8]}"
    remote = enqueue("remote.only", {}, queue=queue)
    both = enqueue("both.sides", {}, queue=queue)
    local = enqueue("ping", queue=queue)
    claimed = claim_jobs(
        queues=[queue],
        worker_id=uuid.uuid4(),
        limit=10,
        lease_seconds=30,
        local_operations=["ping", "both.sides"],
    )
    assert {c.id for c in claimed} == {both.pk, local.pk}
    assert status(remote) == "queued"


def test_claims_follow_priority_then_run_after_across_queues_and_lanes():
    a, b = (f"q-{uuid.uuid4().hex[:8]}" for _ in range(2))
    now = timezone.now()
    ago = [now - timedelta(minutes=m) for m in range(10)]
    specs = {
        "a9_later": JobSpec("ping", queue=a, priority=9, run_after=now + timedelta(hours=1)),
        "a3": JobSpec("ping", queue=a, priority=3, run_after=ago[1]),
        "b3": JobSpec("ping", queue=b, priority=3, run_after=ago[2]),
        "a0_old": JobSpec("ping", queue=a, priority=0, run_after=ago[9]),
        "a0": JobSpec("ping", queue=a, priority=0, run_after=ago[3]),
        "b-2": JobSpec("ping", queue=b, priority=-2, run_after=ago[8]),
        "b0_later": JobSpec("ping", queue=b, priority=0, run_after=now + timedelta(hours=1)),
    }
    jobs = dict(zip(specs, enqueue_many(list(specs.values())), strict=True))
    order = []
    while claimed := claim_jobs(queues=[a, b], worker_id=uuid.uuid4(), limit=1, lease_seconds=30):
        order.append(next(name for name, job in jobs.items() if job.pk == claimed[0].id))
    assert order == ["b3", "a3", "a0_old", "a0", "b-2"]

    # A batch takes the same best jobs at once.
    for name in order:
        Job.objects.filter(pk=jobs[name].pk).update(status="queued")
    batch = claim_jobs(queues=[a, b], worker_id=uuid.uuid4(), limit=3, lease_seconds=30)
    assert {c.id for c in batch} == {jobs[n].pk for n in ("b3", "a3", "a0_old")}


def _pick_buffers(queue: str) -> int:
    """Shared buffers the claim statement touches, from EXPLAIN (ANALYZE, BUFFERS), rolled back."""
    statements: list[tuple[str, list]] = []

    def capture(execute, sql, params, many, context):
        statements.append((sql, params))
        return execute(sql, params, many, context)

    with transaction.atomic():
        with connection.execute_wrapper(capture):
            claimed = claim_jobs(queues=[queue], worker_id=uuid.uuid4(), limit=8, lease_seconds=30)
        assert len(claimed) == 1
        Job.objects.filter(pk=claimed[0].id).update(status="queued")  # as it was
        sql, params = statements[-1]
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", params)
            plan = cursor.fetchone()[0]
        transaction.set_rollback(True)
    plan = plan[0]["Plan"] if isinstance(plan, list) else json.loads(plan)[0]["Plan"]
    return plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]


@postgres_only
def test_a_claim_locks_only_the_jobs_it_takes():
    queue = f"q-{uuid.uuid4().hex[:8]}"
    jobs = enqueue_many([JobSpec("ping", queue=queue, priority=p) for p in (5, 3, 3, 0)])
    with transaction.atomic():  # hold the claim's row locks open
        claimed = claim_jobs(queues=[queue], worker_id=uuid.uuid4(), limit=2, lease_seconds=30)
        assert {c.id for c in claimed} == {jobs[0].pk, jobs[1].pk}
        with independent_connection() as other:
            try:
                with connections[other].cursor() as cursor:
                    for job in jobs[2:]:  # left queued: free for any other claimer at once
                        cursor.execute(
                            "SELECT id FROM controlplane_job WHERE id = %s FOR UPDATE NOWAIT",
                            [job.pk],
                        )
            finally:
                connections[other].close()


@postgres_only
def test_the_claim_does_not_walk_jobs_scheduled_later_at_a_higher_priority():
    queue = f"q-{uuid.uuid4().hex[:8]}"
    tomorrow = timezone.now() + timedelta(days=1)
    ready = enqueue("ping", queue=queue)
    touched = []
    for count in (10_000, 30_000):
        for priority in (1, 5):
            enqueue_many(
                [JobSpec("ping", queue=queue, priority=priority, run_after=tomorrow)] * count
            )
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE controlplane_job")
        touched.append(_pick_buffers(queue))
    # 20,000 -> 80,000 entries ranked above the ready job: a scan through them
    # reads some 35 more index pages per 40,000; a descent per priority lane
    # reads the same pages (one more per descent if the index grows a level).
    assert touched[1] - touched[0] <= 8, touched
    assert status(ready) == "queued"


def test_extend_leases_keeps_held_jobs_and_reports_the_ones_lost():
    queue = f"q-{uuid.uuid4().hex[:8]}"
    enqueue_many([JobSpec("ping", queue=queue) for _ in range(3)])
    worker_id = uuid.uuid4()
    a, b, c = claim_jobs(queues=[queue], worker_id=worker_id, limit=3, lease_seconds=30)
    before = dict(Job.objects.filter(queue=queue).values_list("pk", "leased_until"))
    held = [(a.id, a.lease_token), (b.id, uuid.uuid4()), (c.id, a.lease_token)]
    lost = extend_leases(worker_id=worker_id, held=held, lease_seconds=600)
    assert lost == {b.id, c.id}
    after = dict(Job.objects.filter(queue=queue).values_list("pk", "leased_until"))
    assert after[a.id] > before[a.id]
    assert after[b.id] == before[b.id] and after[c.id] == before[c.id]


@postgres_only
def test_complete_and_claim_fences_completions_and_writes_every_event():
    queue = f"q-{uuid.uuid4().hex[:8]}"
    enqueue_many([JobSpec("sleep", queue=queue, payload={"seconds": 0}) for _ in range(5)])
    worker_id = uuid.uuid4()
    first = claim_jobs(queues=[queue], worker_id=worker_id, limit=2, lease_seconds=30)
    good, stale = first
    moved, claimed = complete_and_claim(
        [
            Completion(good.id, good.lease_token, {"ok": 1}, None, 7),
            Completion(stale.id, uuid.uuid4(), {"ok": 2}, None, 7),  # not its token
        ],
        queues=[queue],
        worker_id=worker_id,
        limit=2,
        lease_seconds=30,
        local_operations=["sleep"],
    )
    assert moved == [good.id]
    assert len(claimed) == 2 and not {c.id for c in claimed} & {good.id, stale.id}
    assert all(c.payload == {"seconds": 0} and c.attempt == 1 for c in claimed)
    done = Job.objects.get(pk=good.id)
    assert (done.status, done.result, done.lease_token) == ("succeeded", {"ok": 1}, None)
    assert status(Job.objects.get(pk=stale.id)) == "running"
    assert timeline(done) == [(1, "job.enqueued"), (2, "job.started"), (3, "job.succeeded")]
    assert JobEvent.objects.get(job_id=good.id, seq=3).fields == {"duration_ms": 7}
    for c in claimed:
        assert timeline(Job(pk=c.id)) == [(1, "job.enqueued"), (2, "job.started")]
        row = Job.objects.get(pk=c.id)
        assert (row.status, row.lease_token, row.worker_id) == ("running", c.lease_token, worker_id)
    # the last queued job; nothing to complete, then nothing left to claim
    moved, last = complete_and_claim(
        [],
        queues=[queue],
        worker_id=worker_id,
        limit=5,
        lease_seconds=30,
    )
    assert moved == [] and len(last) == 1
    moved, none = complete_and_claim(
        [Completion(c.id, c.lease_token) for c in claimed],
        queues=[queue],
        worker_id=worker_id,
        limit=5,
        lease_seconds=30,
    )
    assert sorted(moved) == sorted(c.id for c in claimed) and none == []


@postgres_only
def test_complete_and_claim_skips_remote_only_operations():
    declare_remote("remote.only")
    queue = f"q-{uuid.uuid4().hex[:8]}"
    remote = enqueue("remote.only", {}, queue=queue)
    local = enqueue("ping", queue=queue)
    held = claim_jobs(
        queues=[queue],
        worker_id=uuid.uuid4(),
        limit=1,
        lease_seconds=30,
        local_operations=["ping"],
    )
    assert [h.id for h in held] == [local.pk]
    queued_local = enqueue("ping", queue=queue)
    moved, claimed = complete_and_claim(
        [Completion(held[0].id, held[0].lease_token)],
        queues=[queue],
        worker_id=uuid.uuid4(),
        limit=5,
        lease_seconds=30,
        local_operations=["ping"],
    )
    assert moved == [local.pk] and [c.id for c in claimed] == [queued_local.pk]
    assert status(remote) == "queued"


LOG_LEVELS = ("default", "DEBUG", "WARNING")  # "default": CONTROLPLANE_LOG_LEVEL unset


def test_per_job_lines_are_debug_and_the_log_level_setting_wins(worker):
    # Three burst workers, one per log level, each on a queue of its own: they start
    # together (a worker's start-up is most of this test) and see only their own jobs.
    queues = {level: f"log-{level.lower()}-{uuid.uuid4().hex[:6]}" for level in LOG_LEVELS}
    ok = enqueue("ping", queue=queues["default"])
    bad = enqueue("fail", {"message": "nope"}, queue=queues["default"])
    again = enqueue("ping", queue=queues["DEBUG"])
    warn = enqueue("fail", {"message": "shown"}, queue=queues["WARNING"])
    quiet = worker(queues["default"], args=("--burst",))
    loud = worker(queues["DEBUG"], args=("--burst",), env={"CONTROLPLANE_LOG_LEVEL": "DEBUG"})
    silent = worker(queues["WARNING"], args=("--burst",), env={"CONTROLPLANE_LOG_LEVEL": "WARNING"})
    for proc in (quiet, loud, silent):
        assert proc.wait(timeout=60) == 0, proc.output()

    out = quiet.output()
    assert "worker.started" in out and f"job.failed job_id={bad.pk}" in out
    assert "job.claimed" not in out and "job.succeeded" not in out
    assert status(ok) == "succeeded"

    out = loud.output()
    assert f"job.claimed job_id={again.pk}" in out
    assert f"job.succeeded job_id={again.pk}" in out

    out = silent.output()
    assert "worker.started" not in out
    assert f"WARNING workers job.failed job_id={warn.pk}" in out  # a failure is a warning
    assert status(warn) == "failed"


def test_a_full_drain_keeps_every_timeline_gapless(worker):
    jobs = enqueue_many([JobSpec("ping") for _ in range(400)])
    procs = [worker(args=("--concurrency", "8", "--burst")) for _ in range(2)]
    for proc in procs:
        assert proc.wait(timeout=120) == 0, proc.output()
    ids = [j.pk for j in jobs]
    assert Job.objects.filter(pk__in=ids, status="succeeded").count() == 400
    events = JobEvent.objects.filter(job_id__in=ids).values_list("job_id", "seq", "event")
    by_job: dict[uuid.UUID, list[tuple[int, str]]] = {}
    for job_id, seq, event in events:
        by_job.setdefault(job_id, []).append((seq, event))
    # Stored: seq 2 and 3 of every job; seq 1 is implied by the job row (jobs.timeline).
    stored = [(2, "job.started"), (3, "job.succeeded")]
    assert all(sorted(t) == stored for t in by_job.values()) and len(by_job) == 400
    expected = [(1, "job.enqueued"), *stored]
    assert all(timeline(Job(pk=job_id)) == expected for job_id in ids[:20])
