"""Flow control by key under real concurrency: several ``runworker`` processes, ``kill -9``,
a reaper, a rate-limited key and a key's backlog, judged from the jobs' events alone.

On PostgreSQL and SQLite (one machine, the same semantics).
"""

from __future__ import annotations

import random
import signal
import threading
import time
import uuid
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from jobs import events
from jobs.enqueue import JobSpec, enqueue, enqueue_many
from jobs.models import Job, JobEvent, Worker
from jobs.operator_actions import set_key_limits
from tests.conftest import wait_for
from tests.integration.flow_keys.conftest import max_overlap_by_key, runs_of

pytestmark = pytest.mark.django_db(transaction=True)

ACCOUNTS = 4
ACCOUNT_LIMIT = 2
API_LIMIT = 3
JOBS = 160


def started_count(queue: str) -> int:
    return JobEvent.objects.filter(event=events.JOB_STARTED, job__queue=queue).count()


def succeeded_count(queue: str) -> int:
    return JobEvent.objects.filter(event=events.JOB_SUCCEEDED, job__queue=queue).count()


def busiest_worker_pid(queue: str) -> int | None:
    """The pid of the worker holding the most of the queue's running jobs now."""
    running = Counter(
        Job.objects.filter(queue=queue, status="running").values_list("worker_id", flat=True)
    )
    if not running:
        return None
    busiest = running.most_common(1)[0][0]
    return Worker.objects.filter(pk=busiest).values_list("pid", flat=True).first()


def test_keyed_limits_hold_across_workers_through_a_kill_9(worker, start_process):
    """Three workers of 4 slots each serve 160 short jobs of 4 accounts (2 at once each), a
    third of them also under a shared API key (3 at once); one worker is killed mid-run.

    The dead worker's jobs hold their keys' slots until the reaper rescues them, so at no
    instant do more than the limit of one key's runs overlap, killed runs included, and
    every job succeeds exactly once.
    """
    queue = f"keyed-kill-{uuid.uuid4().hex[:6]}"
    set_key_limits("acct", {"concurrency": ACCOUNT_LIMIT})
    set_key_limits("api", {"concurrency": API_LIMIT})
    rng = random.Random(30)
    specs = []
    for n in range(JOBS):
        keys = [f"acct:{n % ACCOUNTS}"] + (["api:shared"] if n % 3 == 0 else [])
        seconds = round(rng.uniform(0.05, 0.2), 3)
        specs.append(
            JobSpec("sleep", {"seconds": seconds, "emit_every": 1}, queue=queue, keys=keys)
        )
    ids = [job.pk for job in enqueue_many(specs)]

    procs = [worker(queue, args=("--concurrency", "4")) for _ in range(3)]
    reaper = start_process("reaper", "--interval", "0.2")
    # Mid-run, kill -9 the worker holding the most running jobs.
    wait_for(lambda: succeeded_count(queue) >= 20, timeout=30, message="the run under way")
    victim_pid = wait_for(lambda: busiest_worker_pid(queue), timeout=30, message="a busy worker")
    victim = next(proc for proc in procs if proc.pid == victim_pid)
    victim.signal(signal.SIGKILL)
    victim.popen.wait(timeout=10)
    wait_for(
        lambda: succeeded_count(queue) >= JOBS,
        timeout=30,
        message="every job succeeded",
    )
    for proc in procs:
        assert proc is victim or proc.popen.poll() is None, proc.output()

    succeeded = Counter(
        JobEvent.objects.filter(job_id__in=ids, event=events.JOB_SUCCEEDED).values_list(
            "job_id", flat=True
        )
    )
    assert set(succeeded) == set(ids)  # none lost
    assert set(succeeded.values()) == {1}  # none succeeded twice
    assert set(Job.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"succeeded"}

    runs = runs_of(ids)
    assert all(run.ended is not None for run in runs)
    rescued = [run for run in runs if run.end_event == events.JOB_LEASE_EXPIRED_REQUEUE]
    assert rescued, "the killed worker's jobs were rescued"
    assert len(runs) == JOBS + len(rescued)  # a second run only after a rescue
    overlap = max_overlap_by_key(runs)
    held = max((run.ended - run.started).total_seconds() for run in rescued)
    print(
        f"max overlap by key: {dict(sorted(overlap.items()))}; runs: {len(runs)}; "
        f"rescued: {len(rescued)}, a killed run held its keys up to {held:.1f} s"
    )
    for n in range(ACCOUNTS):
        assert overlap[f"acct:{n}"] <= ACCOUNT_LIMIT, overlap
    assert overlap["api:shared"] <= API_LIMIT, overlap
    # The limits were reached, not merely never approached: 8 of 12 slots at most.
    assert max(overlap[f"acct:{n}"] for n in range(ACCOUNTS)) == ACCOUNT_LIMIT, overlap
    reaper.signal(signal.SIGTERM)
    assert reaper.wait(timeout=10) == 0, reaper.output()


def test_jobs_requeued_by_a_sigterm_keep_their_keys_limits(worker):
    """A worker stopped by SIGTERM with a short grace requeues its keyed jobs
    (``job.requeued``); another worker runs them, within the keys' limits, each once."""
    queue = f"keyed-term-{uuid.uuid4().hex[:6]}"
    set_key_limits("acct", {"concurrency": 2})
    nap = {"seconds": 1.5, "emit_every": 0.5}
    ids = [
        j.pk
        for j in enqueue_many(
            [JobSpec("sleep", nap, queue=queue, keys=[f"acct:{n % 2}"]) for n in range(8)]
        )
    ]
    leaving = worker(
        queue, args=("--concurrency", "4"), env={"CONTROLPLANE_SHUTDOWN_GRACE_SECONDS": "0.3"}
    )
    wait_for(
        lambda: Job.objects.filter(queue=queue, status="running").count() == 4,
        timeout=30,
        message="four jobs running, two of each key",
    )
    staying = worker(queue, args=("--concurrency", "4"))
    leaving.signal(signal.SIGTERM)
    assert leaving.wait(timeout=20) == 143, leaving.output()
    wait_for(lambda: succeeded_count(queue) >= len(ids), timeout=30, message="every job")
    assert staying.popen.poll() is None, staying.output()
    runs = runs_of(ids)
    requeued = [r for r in runs if r.end_event == events.JOB_REQUEUED]
    overlap = max_overlap_by_key(runs)
    print(f"requeued by SIGTERM: {len(requeued)}; max overlap by key: {overlap}")
    assert len(requeued) == 4
    assert len(runs) == len(ids) + len(requeued)
    assert overlap == {"acct:0": 2, "acct:1": 2}
    succeeded = Counter(
        JobEvent.objects.filter(job_id__in=ids, event=events.JOB_SUCCEEDED).values_list(
            "job_id", flat=True
        )
    )
    assert set(succeeded) == set(ids) and set(succeeded.values()) == {1}


def test_a_limit_lowered_at_run_time_holds_for_every_later_start(worker):
    """An operator lowers a key's concurrency from 3 to 1 while two workers run its jobs:
    the runs already going finish, and no start after the change has company."""
    queue = f"keyed-change-{uuid.uuid4().hex[:6]}"
    set_key_limits("acct", {"concurrency": 3})
    nap = {"seconds": 0.1, "emit_every": 1}
    ids = [
        j.pk
        for j in enqueue_many(
            [JobSpec("sleep", nap, queue=queue, keys=["acct:1"]) for _ in range(40)]
        )
    ]
    for _ in range(2):
        worker(queue, args=("--concurrency", "4"))
    wait_for(lambda: succeeded_count(queue) >= 10, timeout=30, message="the run under way")
    set_key_limits("acct", {"concurrency": 1})  # workers read limits at each claim here
    # A claim that read the limits just before the change may still start under them.
    changed = timezone.now() + timedelta(seconds=0.25)
    wait_for(lambda: succeeded_count(queue) >= len(ids), timeout=30, message="every job")
    runs = runs_of(ids)
    before = max_overlap_by_key([r for r in runs if r.started < changed])
    later = [r for r in runs if r.started > changed]
    company = max(
        sum(1 for other in runs if other.started <= run.started < (other.ended or run.started))
        for run in later
    )
    print(
        f"at most {before['acct:1']} at once before the change; a later start had "
        f"{company} run(s) going, itself included"
    )
    assert before["acct:1"] == 3
    assert company == 1, company


RATE = 5.0
WINDOW_SECONDS = 10.0


def test_a_rate_limited_key_starts_its_rate_across_two_workers(worker):
    """A key limited to 5 a second (burst 5), a backlog growing faster than that, two workers:
    over 10 s after the first burst the key starts within 10% of 50 jobs."""
    queue = f"keyed-rate-{uuid.uuid4().hex[:6]}"
    set_key_limits("api", {"rate": RATE, "burst": RATE})
    specs = [JobSpec("ping", queue=queue, keys=["api:7"]) for _ in range(60)]
    enqueue_many(specs)
    procs = [worker(queue, args=("--concurrency", "4")) for _ in range(2)]

    stop = threading.Event()
    errors: list[BaseException] = []

    def feed() -> None:  # twice the rate: the bucket, not the work, sets the pace
        try:
            while not stop.is_set():
                enqueue("ping", queue=queue, keys=["api:7"])
                stop.wait(0.1)
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)
        finally:
            connection.close()

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        wait_for(
            lambda: started_count(queue) >= RATE,
            timeout=30,
            message="the first burst",
        )
        window_start = timezone.now()
        time.sleep(WINDOW_SECONDS)
        window_end = timezone.now()
    finally:
        stop.set()
        feeder.join(timeout=10)
    assert not errors, errors
    for proc in procs:
        assert proc.popen.poll() is None, proc.output()

    started = list(
        JobEvent.objects.filter(
            event=events.JOB_STARTED, job__queue=queue, ts__gte=window_start, ts__lt=window_end
        ).values_list("fields", flat=True)
    )
    expected = RATE * (window_end - window_start).total_seconds()
    print(f"starts in the window: {len(started)}, expected {expected:.1f}")
    assert abs(len(started) - expected) <= 0.1 * expected, (len(started), expected)
    assert Job.objects.filter(queue=queue, status="queued").count() > 10  # the backlog stayed
    assert len({fields["worker"] for fields in started}) == 2  # the key's, not each worker's


BIG, SMALL = 2000, 20


def starts_of(queue: str) -> list[tuple[object, object]]:
    """``(job id, ts)`` of the queue's starts, in the order they happened."""
    return list(
        JobEvent.objects.filter(event=events.JOB_STARTED, job__queue=queue)
        .order_by("ts", "id")
        .values_list("job_id", "ts")
    )


def keyed(queue: str, key: str, n: int) -> list[JobSpec]:
    return [JobSpec("ping", queue=queue, keys=[key]) for _ in range(n)]


def all_started(job_ids: set) -> bool:
    started = JobEvent.objects.filter(event=events.JOB_STARTED, job_id__in=job_ids)
    return started.count() >= len(job_ids)


def test_a_later_key_is_not_stuck_behind_a_big_backlog(worker):
    """2,000 jobs of key A, then 20 of key B in the same queue, then two workers: B's last
    job starts before A's 100th (round-robin turns). Later, with A's backlog draining, 20
    jobs of key C start within 100 of A's starts too."""
    queue = f"keyed-fair-{uuid.uuid4().hex[:6]}"
    nap = {"seconds": 0.005, "emit_every": 1}
    enqueue_many([JobSpec("sleep", nap, queue=queue, keys=["t:A"]) for _ in range(BIG)])
    b_ids = {j.pk for j in enqueue_many(keyed(queue, "t:B", SMALL))}
    for _ in range(2):
        worker(queue, args=("--concurrency", "4"))
    wait_for(lambda: all_started(b_ids), timeout=30, message="every B job started")
    starts = starts_of(queue)
    last_b = max(ts for job_id, ts in starts if job_id in b_ids)
    a_before_b = sum(1 for job_id, ts in starts if job_id not in b_ids and ts <= last_b)

    wait_for(lambda: len(starts_of(queue)) >= 300, timeout=30, message="A draining on")
    c_enqueued = timezone.now()
    c_ids = {j.pk for j in enqueue_many(keyed(queue, "t:C", SMALL))}
    wait_for(lambda: all_started(c_ids), timeout=30, message="every C job started")
    starts = starts_of(queue)
    last_c = max(ts for job_id, ts in starts if job_id in c_ids)
    a_meanwhile = sum(
        1 for job_id, ts in starts if job_id not in b_ids | c_ids and c_enqueued <= ts <= last_c
    )
    print(
        f"A starts before B's last: {a_before_b}; after C's enqueue, before its last: {a_meanwhile}"
    )
    assert a_before_b < 100, a_before_b
    assert a_meanwhile < 100, a_meanwhile
    assert Job.objects.filter(queue=queue, status="queued").count() > 100  # A still waiting


# More keys at their limit than a claim's window holds (jobs.keyed_claims.window_size, at
# most 4 x the claim's limit: 40 turns for 10 free slots): the window reads past them.
BUSY_KEYS = 70


def test_a_key_with_room_starts_while_many_keys_wait_at_their_limit(worker):
    """70 keys of concurrency 1 each run a long job and have one more waiting; a new key's
    job then starts at once on the worker's free slots, not when the long jobs end."""
    queue = f"keyed-busy-{uuid.uuid4().hex[:6]}"
    set_key_limits("busy", {"concurrency": 1})
    long_nap = {"seconds": 20, "emit_every": 10}
    enqueue_many(
        [
            JobSpec("sleep", long_nap, queue=queue, keys=[f"busy:{n}"])
            for n in range(BUSY_KEYS)
            for _ in range(2)
        ]
    )
    worker(queue, args=("--concurrency", str(BUSY_KEYS + 10)))
    wait_for(
        lambda: Job.objects.filter(queue=queue, status="running").count() == BUSY_KEYS,
        timeout=30,
        message="one job of each busy key running",
    )
    newcomer = enqueue("ping", queue=queue, keys=["fresh:1"])
    wait_for(
        lambda: Job.objects.filter(pk=newcomer.pk, status="succeeded").exists(),
        timeout=5,
        message="the new key's job, with 10 slots free",
    )


def test_the_first_keyed_job_of_a_new_queue_starts_without_waiting_a_poll(worker):
    """A worker that served the queue's plain jobs meets its first keyed job at once: settings
    cached from before the queue became keyed are read afresh after a claim found nothing.
    PostgreSQL: the enqueue's NOTIFY wakes the worker (SQLite workers poll)."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite workers find new jobs by polling, not by a wake-up")
    queue = f"keyed-new-{uuid.uuid4().hex[:6]}"
    proc = worker(queue, env={"CONTROLPLANE_POLL_SECONDS": "30"})
    plain = enqueue("ping", queue=queue)
    wait_for(lambda: Job.objects.get(pk=plain.pk).status == "succeeded", timeout=20)
    keyed = enqueue("ping", queue=queue, keys=["fresh:1"])
    wait_for(
        lambda: Job.objects.get(pk=keyed.pk).status == "succeeded",
        timeout=10,
        message="the first keyed job (a 30 s poll would miss this)",
    )
    proc.signal(signal.SIGTERM)
    assert proc.wait() == 0
