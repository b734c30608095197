"""The real client (``controlplane_client``) in its own process against a real daphne server."""

from __future__ import annotations

import signal
import time

import pytest

from jobs.enqueue import enqueue
from jobs.models import Job, JobEvent, Worker
from jobs.transitions import cancel_job
from tests.conftest import wait_for

from .helpers import events_of, job_status

pytestmark = pytest.mark.django_db(transaction=True)


def worker_id_of(client) -> str:
    out = client.wait_output("READY ")
    return out.split("READY ", 1)[1].split()[0]


def pushed_and_idle(server, worker_id: str) -> bool:
    """The server logged the worker's socket connected, then a claim answered after it (the
    one a new socket prompts): from here on only a push makes the worker claim soon."""
    log = server.proc.output()
    connected = log.find(f'"WSCONNECT /ws/workers/{worker_id}"')
    return connected >= 0 and f'"POST /workers/{worker_id}/claim"' in log[connected:]


def succeeded(job_id) -> Job | None:
    job = Job.objects.get(pk=job_id)
    return job if job.status == "succeeded" else None


def test_auto_serve_runs_jobs_end_to_end(start_client, server):
    client = start_client("--mode", "auto", "--concurrency", "2")
    worker_id = worker_id_of(client)
    worker = Worker.objects.get(pk=worker_id)
    assert worker.kind == "remote" and worker.name == "test-client"
    jobs = [enqueue("remote.echo", {"text": f"hello {i}"}) for i in range(3)]
    flaky = enqueue("remote.flaky", {})
    broken = enqueue("remote.broken", {})
    for i, job in enumerate(jobs):
        done = wait_for(lambda job=job: succeeded(job.pk), message=f"job {i} to succeed")
        assert done.result == {"echo": f"hello {i}", "attempt": 1}
        assert (done.progress_current, done.progress_total) == (1, 1)
        assert events_of(job.pk) == ["job.enqueued", "job.started", "job.progress", "job.succeeded"]
    # A retryable failure comes back with backoff and succeeds on the next attempt.
    done = wait_for(lambda: succeeded(flaky.pk), message="the flaky job to succeed")
    assert done.result == {"attempt": 2}
    assert "job.retry_scheduled" in events_of(flaky.pk)
    # Any other exception fails the job with the exception's name and message.
    wait_for(lambda: job_status(broken.pk) == "failed", message="the broken job to fail")
    broken.refresh_from_db()
    assert (broken.error_code, broken.error_message) == ("ValueError", "broken on purpose")
    # A result that is not JSON fails the job rather than leaving it to its lease.
    odd = enqueue("remote.broken", {"unserialisable": True})
    wait_for(lambda: job_status(odd.pk) == "failed", message="the odd result to fail")
    assert Job.objects.get(pk=odd.pk).error_code == "InvalidResult"
    # SIGTERM: a graceful goodbye removes the worker.
    client.signal(signal.SIGTERM)
    assert client.wait() == 0, client.output()
    assert "STOPPED" in client.output()
    assert not Worker.objects.filter(pk=worker_id).exists()


def test_deferred_result_and_cancellation_reach_the_client(start_client, server):
    client = start_client("--mode", "auto")
    worker_id = worker_id_of(client)
    coordinator = enqueue("remote.deferred", {"finish_after": 3.0})
    wait_for(
        lambda: JobEvent.objects.filter(job=coordinator, event="job.deferred").exists(),
        message="the deferred result",
    )
    coordinator.refresh_from_db()
    assert (coordinator.status, coordinator.result) == ("running", {"partial": True})
    assert coordinator.lease_token is not None  # still held by the client
    # Its heartbeats keep the lease alive until the client finishes the job itself.
    leased = coordinator.leased_until
    wait_for(
        lambda: Job.objects.get(pk=coordinator.pk).leased_until > leased,
        message="a heartbeat to extend the deferred job's lease",
    )
    client.wait_output(f"FINISHED {coordinator.pk} succeeded")
    coordinator.refresh_from_db()
    assert (coordinator.status, coordinator.result) == ("succeeded", {"final": True})
    slow = enqueue("remote.slow", {"seconds": 30})
    wait_for(lambda: Job.objects.get(pk=slow.pk).progress_current >= 2, message="slow progress")
    cancel_job(slow.pk, reason="operator")
    # The client hears of it (a refused emit or the heartbeat) and stops early: it logs the
    # stop or the refused report, and is done with the job. Its next heartbeat does not
    # overwrite the cancellation either.
    client.wait_output(f"job {slow.pk}")
    seen = len(server.proc.output())
    wait_for(
        lambda: f'"PATCH /workers/{worker_id}"' in server.proc.output()[seen:],
        timeout=10,
        interval=0.02,
        message="a heartbeat after the client let the job go",
    )
    assert job_status(slow.pk) == "cancelled"
    assert events_of(slow.pk)[-1] == "job.cancelled"


def test_manual_mode_claims_listens_and_reports(start_client, server):
    client = start_client("--mode", "manual", "--count", "3")
    worker_id = worker_id_of(client)
    jobs = [enqueue("remote.echo", {"text": f"m{i}"}) for i in range(2)]
    client.wait_output(f"DONE {jobs[1].pk}")
    later = enqueue("remote.echo", {"text": "late"})
    client.wait_output("STOPPED")
    assert client.wait() == 0
    for job in [*jobs, later]:
        job.refresh_from_db()
        assert job.status == "succeeded" and job.result["echo"] == job.payload["text"]
        assert events_of(job.pk) == [
            "job.enqueued",
            "job.started",
            "job.client_started",
            "job.progress",
            "job.succeeded",
        ]
        assert f"DONE {job.pk} succeeded" in client.output()
    assert not Worker.objects.filter(pk=worker_id).exists()


def test_push_less_client_gets_every_job_by_polling(start_client, server):
    client = start_client(
        "--mode", "auto", "--no-websocket", "--long-poll", "0", "--polling-interval", "0.2"
    )
    worker_id_of(client)
    jobs = []
    for i in range(6):
        jobs.append(enqueue("remote.echo", {"text": str(i)}))
        time.sleep(0.1)
    for job in jobs:
        wait_for(lambda job=job: succeeded(job.pk), message="every job to succeed by polling")


def test_a_dropped_push_with_the_socket_up_is_covered_by_polling(start_client, server):
    """The socket is connected (so the client does not long-poll) but every push is lost:
    the job is still found, by the next poll."""
    client = start_client(
        "--mode", "auto", "--long-poll", "0", "--polling-interval", "0.5", "--drop-pushes"
    )
    worker_id_of(client)
    client.wait_output("PUSH UP")
    job = enqueue("remote.echo", {"text": "unannounced"})
    wait_for(lambda: succeeded(job.pk), timeout=10, message="polling to find the job")
    assert "PUSH DROPPED" in client.output()


def test_websocket_push_wakes_a_client_that_would_poll_slowly(start_client, server):
    # Polling every 60 s and no long-poll: only the push can make this fast.
    client = start_client("--mode", "auto", "--long-poll", "0", "--polling-interval", "60")
    worker_id = worker_id_of(client)
    wait_for(
        lambda: pushed_and_idle(server, worker_id),
        timeout=10,
        interval=0.02,
        message="the socket up and the claim it prompts behind us",
    )
    started = time.monotonic()
    job = enqueue("remote.echo", {"text": "pushed"})
    wait_for(lambda: succeeded(job.pk), timeout=10, message="the pushed job to succeed")
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_manual_listen_stops_gracefully_on_a_signal(start_client, server, sig):
    """A signal during ``listen()``: the job in hand finishes and is reported, then the
    worker says goodbye (exit 0, worker row removed) instead of dying mid-protocol."""
    client = start_client("--mode", "manual", "--count", "10", "--long-poll", "1")
    worker_id = worker_id_of(client)
    job = enqueue("remote.slow", {"seconds": 1.5})
    # Its first progress report, not "running" (set at claim, before listen() yields it),
    # proves the job is in the client's hands.
    wait_for(
        lambda: Job.objects.get(pk=job.pk).progress_current >= 1,
        message="the slow job to report progress",
    )
    client.signal(sig)
    assert client.wait() == 0, client.output()
    assert f"DONE {job.pk} succeeded" in client.output()
    assert "STOPPED" in client.output()
    assert not Worker.objects.filter(pk=worker_id).exists()


def test_sigterm_mid_job_requeues_it_without_counting_the_attempt(start_client, server):
    client = start_client("--mode", "auto", "--grace", "0.3")
    worker_id = worker_id_of(client)
    job = enqueue("remote.slow", {"seconds": 30})
    wait_for(lambda: job_status(job.pk) == "running", message="the slow job to start")
    client.signal(signal.SIGTERM)
    assert client.wait() == 0, client.output()
    job.refresh_from_db()
    assert (job.status, job.attempts, job.worker_id) == ("queued", 0, None), (
        events_of(job.pk),
        client.output(),
    )
    assert "job.requeued" in events_of(job.pk)
    assert not Worker.objects.filter(pk=worker_id).exists()


def test_killed_client_is_swept_and_its_job_runs_elsewhere(start_client, start_process, server):
    client = start_client("--mode", "auto")
    worker_id = worker_id_of(client)
    job = enqueue("remote.slow", {"seconds": 30})
    wait_for(lambda: job_status(job.pk) == "running", message="the slow job to start")
    client.signal(signal.SIGKILL)
    client.wait()
    reaper = start_process("reaper", "--interval", "0.3")
    wait_for(
        lambda: not Worker.objects.filter(pk=worker_id).exists(),
        timeout=20,
        message="the reaper to sweep the silent worker",
    )
    wait_for(lambda: job_status(job.pk) == "queued", message="the job to be requeued")
    assert "job.lease_expired_requeue" in events_of(job.pk)
    reaper.signal(signal.SIGTERM)
    # A new client picks it up and finishes it.
    Job.objects.filter(pk=job.pk).update(payload={"seconds": 0.2})
    start_client("--mode", "auto")
    wait_for(lambda: succeeded(job.pk), message="the requeued job to succeed elsewhere")


def test_long_polling_client_gets_jobs_and_stops_promptly(start_client, server):
    client = start_client("--mode", "auto", "--no-websocket", "--long-poll", "20")
    worker_id = worker_id_of(client)
    time.sleep(0.5)  # parked in a long-poll
    job = enqueue("remote.echo", {"text": "woken"})
    wait_for(lambda: succeeded(job.pk), timeout=5, message="the long-poll to hand the job over")
    started = time.monotonic()
    client.signal(signal.SIGTERM)
    assert client.wait() == 0, client.output()
    assert time.monotonic() - started < 5
    # It said goodbye and did not come back from its last long-poll.
    assert not Worker.objects.exists(), list(Worker.objects.values("id", "name"))
    assert "registering again" not in client.output()
    assert worker_id not in Worker.objects.values_list("id", flat=True)


def test_swept_client_registers_again_and_keeps_serving(start_client, server):
    client = start_client("--mode", "auto", "--long-poll", "2")
    first = worker_id_of(client)
    Worker.objects.filter(pk=first).delete()  # what the reaper does to a silent worker
    wait_for(
        lambda: Worker.objects.filter(name="test-client").exclude(pk=first).exists(),
        message="the client to register again",
    )
    assert "registering again" in client.output()
    job = enqueue("remote.echo", {"text": "after the sweep"})
    wait_for(lambda: succeeded(job.pk), message="the job to run on the new registration")
