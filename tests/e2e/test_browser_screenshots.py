"""Screenshots of every page, light and dark, desktop and phone, over realistic data.

Always taken (a page that fails to render fails here); written to
``docs/screenshots/`` when ``DASHBOARD_SCREENSHOTS=1``, else to a temporary
directory.
"""

from __future__ import annotations

import math
import os
import random
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from jobs.claims import claim_jobs
from jobs.metrics import buckets
from jobs.metrics.rollup import EVENTS_CURSOR
from jobs.models import (
    Job,
    JobEvent,
    MetricCursor,
    MetricRollup,
    MetricTotal,
    Queue,
    Schedule,
    ScheduleFire,
    Worker,
)
from jobs.operations import operation, registry
from jobs.schedules.firing import fire_due_schedules
from jobs.schedules.services import create_schedule, pause_schedule, run_schedule_now
from jobs.transitions import complete_job, emit_event, fail_job
from tests.conftest import ROOT
from tests.factories import (
    cancelled,
    failed,
    make_user,
    queued,
    running,
    succeeded,
    tick,
    worker,
)

pytestmark = pytest.mark.e2e

OPERATIONS = ["invoices.render", "emails.send", "reports.nightly", "embeddings.compute"]
for _name in OPERATIONS:
    if _name not in registry:
        operation(_name)(lambda ctx, payload: payload)


def _realistic_data() -> Job:
    """A few queues, workers and a running job with a story; returns that job."""
    rng = random.Random(7)
    now = timezone.now()
    alive = worker(hostname="worker-eu-1", pid=31337, queues=["default", "emails"], concurrency=8)
    worker(hostname="worker-eu-2", pid=4120, queues=["reports", "default"], concurrency=4)
    dead = worker(stale=True, hostname="worker-us-3", pid=977, queues=["emails"], concurrency=4)
    finished = []
    for i in range(90):
        op = rng.choice(OPERATIONS[:3])
        queue = {
            "invoices.render": "default",
            "emails.send": "emails",
            "reports.nightly": "reports",
        }[op]
        payload = {"account": rng.randint(1, 60), "attempt_hint": i % 3}
        if i % 11 == 0:
            job = failed(
                op,
                payload,
                queue=queue,
                worker_id=alive.pk,
                code=rng.choice(["SMTPServerDisconnected", "TimeoutError"]),
                message=rng.choice(
                    [
                        "Connection unexpectedly closed by smtp.example.net",
                        "Upstream PDF renderer did not answer in 30 s",
                    ]
                ),
            )
        else:
            job = succeeded(op, payload, queue=queue, worker_id=alive.pk)
        finished.append(job)
    for job in finished:  # spread over the last hour for the chart
        ago = timedelta(seconds=rng.randint(0, 3500))
        Job.objects.filter(pk=job.pk).update(
            created_at=now - ago - timedelta(seconds=3),
            started_at=now - ago - timedelta(seconds=2),
            finished_at=now - ago,
        )
    for _ in range(14):
        queued("emails.send", {"account": rng.randint(1, 60)}, queue="emails")
    for _ in range(5):
        queued("reports.nightly", {"period": "2025-01"}, queue="reports")
    cancelled("invoices.render", {"account": 12}, queue="default")
    running("emails.send", {"to": "ops@example.com"}, queue="emails", worker_id=dead.pk)
    Queue.objects.create(name="reports", paused=True)
    Queue.objects.create(name="emails", concurrency_cap=20)
    _operator_history(now, finished[0])
    _schedules(now, alive.pk)
    _metric_history(now, rng)

    star, held = running(
        "embeddings.compute",
        {"model": "esm2-650M", "proteins": 12000, "batch_size": 1000},
        queue="default",
        worker_id=alive.pk,
    )
    for kid in range(3):
        queued("embeddings.compute", {"batch": kid}, queue="default", parent=star.pk)
    emit_event(
        star.pk,
        event="embeddings.plan",
        message="12 batches of 1,000 sequences",
        fields={"batches": 12, "device": "cuda:0"},
        lease_token=held.lease_token,
    )
    for step in range(1, 8):
        tick(star, held, step, 12, f"batch {step} embedded")
    emit_event(
        star.pk,
        event="embeddings.slow_batch",
        level="warning",
        message="batch 7 took 41 s (median 18 s)",
        fields={"batch": 7, "seconds": 41.2},
        lease_token=held.lease_token,
    )
    started = now - timedelta(minutes=6)
    Job.objects.filter(pk=star.pk).update(
        created_at=started - timedelta(seconds=4), started_at=started
    )
    for event in JobEvent.objects.filter(job=star).order_by("seq"):
        JobEvent.objects.filter(pk=event.pk).update(
            ts=started + timedelta(seconds=31 * (event.seq - 2))
        )
    return star


def _operator_history(now, job: Job) -> None:
    """A few audit rows, as if operators had used the dashboard this morning."""
    from jobs import audit
    from jobs.models import OperatorAction

    linus = make_user("operator", "linus")
    entries = [
        (audit.PAUSE, "reports", 0, {}, "month-end freeze", 95),
        (audit.SET_CAP, "emails", 0, {"concurrency_cap": 20}, "", 80),
        (
            audit.BULK_RETRY,
            "filter",
            37,
            {"scope": "filter", "status": ["failed"], "queue": "emails"},
            "SMTP relay is back",
            42,
        ),
        (audit.CANCEL, str(job.pk), 1, {}, "duplicate invoice", 12),
    ]
    for action, target, count, filters, reason, minutes in entries:
        row = audit.record_action(
            linus, action, target=target, count=count, filters=filters, reason=reason
        )
        OperatorAction.objects.filter(pk=row.pk).update(at=now - timedelta(minutes=minutes))


def _schedules(now, worker_id) -> None:
    """A few schedules with an hour of history, made and fired through ``jobs.schedules``.

    The reaper's step is replayed every 30 s of the last hour (``fire_due_schedules``
    at that instant), with the runs finishing as they go: the sweep's second run
    fails, the digest's runs of the last 25 minutes wait (so its later slots are skipped).
    """
    hour_ago = now - timedelta(hours=1)
    nightly = create_schedule(
        {
            "name": "nightly-reports",
            "operation": "reports.nightly",
            "cron": "0 2 * * *",
            "timezone": "Europe/Berlin",
            "queue": "reports",
            "payload": {"period": "yesterday"},
        },
        source="code",
        now=hour_ago,
    )
    digest = create_schedule(
        {
            "name": "email-digest",
            "operation": "emails.send",
            "every_seconds": 600,
            "queue": "digests",
            "overlap": "skip",
            "payload": {"template": "digest", "audience": "ops"},
        },
        now=hour_ago,
    )
    sweep = create_schedule(
        {
            "name": "invoice-sweep",
            "operation": "invoices.render",
            "every_seconds": 1200,
            "queue": "sweeps",
            "payload": {"older_than_days": 30},
        },
        now=hour_ago,
    )
    refresh = create_schedule(
        {
            "name": "embeddings-refresh",
            "operation": "embeddings.compute",
            "cron": "*/30 * * * *",
            "timezone": "America/New_York",
            "payload": {"model": "esm2-650M"},
        },
        now=hour_ago,
    )
    Schedule.objects.update(created_at=hour_ago - timedelta(days=3))
    pause_schedule(refresh.pk, by=make_user("operator", "margaret"), reason="GPU maintenance")
    sweeps = 0
    for step in range(121):
        at = hour_ago + timedelta(seconds=30 * step)
        fire_due_schedules(at)
        queues = [sweep.queue] if at < now - timedelta(minutes=15) else []
        if at < now - timedelta(minutes=25):  # later, a digest waits: its next slot is skipped
            queues.append(digest.queue)
        if not queues:
            continue
        for held in claim_jobs(queues=queues, worker_id=worker_id, limit=10, lease_seconds=60):
            sweeps += held.queue == sweep.queue
            if sweeps == 2 and held.queue == sweep.queue:
                fail_job(
                    held.id,
                    lease_token=held.lease_token,
                    error_code="TimeoutError",
                    error_message="The billing API did not answer in 30 s",
                )
            else:
                complete_job(held.id, lease_token=held.lease_token, result={})
    run_schedule_now(nightly.pk, by=make_user("operator", "ken"), reason="re-run after fix")
    for fire in ScheduleFire.objects.exclude(job=None):  # each job ran when its slot fired
        at = fire.fired_at
        Job.objects.filter(pk=fire.job_id).update(created_at=at)
        Job.objects.filter(pk=fire.job_id, finished_at__isnull=False).update(
            started_at=at + timedelta(seconds=1), finished_at=at + timedelta(seconds=4)
        )
        for event in JobEvent.objects.filter(job_id=fire.job_id):
            JobEvent.objects.filter(pk=event.pk).update(ts=at + timedelta(seconds=event.seq))


# Per queue: (operation, jobs a minute, failure share, wait and run time bucket indexes).
METRIC_MIX = {
    "default": ("invoices.render", 14, 0.02, (3, 5), (6, 8)),
    "emails": ("emails.send", 22, 0.04, (2, 4), (4, 6)),
    "reports": ("reports.nightly", 2, 0.01, (5, 8), (11, 13)),
}


def _metric_history(now, rng: random.Random) -> None:
    """A day of rollup minutes as the reaper would have written them: a daily swell, and
    an incident on ``emails`` five hours ago (failures and waits up for 40 minutes)."""
    now = now.replace(second=0, microsecond=0)
    rows = []
    for ago in range(1, 24 * 60):
        swell = 1 + 0.5 * math.sin(2 * math.pi * (ago + 300) / 1440)
        for queue, (op, rate, fail, wait, run) in METRIC_MIX.items():
            incident = queue == "emails" and 280 <= ago <= 320
            finished = max(0, round(rng.gauss(rate * swell, rate * 0.15)))
            failed_n = sum(rng.random() < (0.3 if incident else fail) for _ in range(finished))
            waits, runs = buckets.empty(), buckets.empty()
            for _ in range(finished):
                waits[rng.randint(*((9, 11) if incident else wait))] += 1
                runs[rng.randint(*run)] += 1
            rows.append(
                MetricRollup(
                    minute=now - timedelta(minutes=ago),
                    queue=queue,
                    operation=op,
                    started=finished,
                    succeeded=finished - failed_n,
                    failed=failed_n,
                    wait_bucket_counts=waits,
                    run_bucket_counts=runs,
                )
            )
    MetricRollup.objects.bulk_create(rows, batch_size=1000)
    for queue, (op, *_) in METRIC_MIX.items():
        MetricTotal.objects.create(queue=queue, operation=op)
    last = JobEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0
    MetricCursor.objects.update_or_create(
        name=EVENTS_CURSOR, defaults={"last_event_id": last, "rolled_up_at": now}
    )


def _heartbeats() -> None:
    """Live workers beat while the screenshots are taken (the test server's timeout is 3 s)."""
    Worker.objects.exclude(hostname="worker-us-3").update(last_heartbeat=timezone.now())


def test_screenshots_of_every_page(open_page, tmp_path) -> None:
    out = (
        ROOT / "docs" / "screenshots"
        if os.environ.get("DASHBOARD_SCREENSHOTS") == "1"
        else tmp_path
    )
    out.mkdir(parents=True, exist_ok=True)
    star = _realistic_data()

    def shoot(page, name: str, full: bool = True) -> Path:
        page.wait_for_timeout(300)  # relative times and the live pill settle
        path = out / f"{name}.png"
        page.screenshot(path=str(path), full_page=full)
        assert path.stat().st_size > 5_000
        return path

    login = open_page(None)
    login.goto("/accounts/login/")
    shoot(login, "login", full=False)

    page = open_page("operator", username="ada")
    pages = [
        ("overview", "/dashboard/"),
        ("jobs", "/dashboard/jobs/"),
        ("job-detail", f"/dashboard/jobs/{star.pk}/"),
        ("workers", "/dashboard/workers/"),
        ("queues", "/dashboard/queues/"),
    ]
    for name, path in pages:
        _heartbeats()
        page.goto(path)
        expect(page.locator("#live")).to_have_attribute("data-state", "live")
        shoot(page, name)
    page.goto("/dashboard/jobs/?status=failed")
    shoot(page, "jobs-failed")
    # Plain pages (no live pill): the schedules and one schedule with its history.
    page.goto("/dashboard/schedules/")
    expect(page.locator("table.schedules tbody tr")).to_have_count(4)
    shoot(page, "schedules")
    page.get_by_role("link", name="invoice-sweep").click()
    expect(page.locator("#schedule-history tbody tr").first).to_be_visible()
    shoot(page, "schedule-detail")
    # Metrics: a day of the rollup, every queue; then one queue in the dark theme.
    page.goto("/dashboard/metrics/?window=24h")
    expect(page.locator("#metric-charts figure")).to_have_count(4)
    shoot(page, "metrics")

    dark = open_page("viewer", username="grace", color_scheme="dark")
    for name, path in (
        ("overview-dark", "/dashboard/"),
        ("job-detail-dark", f"/dashboard/jobs/{star.pk}/"),
        ("metrics-dark", "/dashboard/metrics/?window=24h&queue=emails"),
    ):
        _heartbeats()
        dark.goto(path)
        shoot(dark, name)

    phone = open_page("operator", viewport={"width": 390, "height": 844})
    _heartbeats()
    phone.goto(f"/dashboard/jobs/{star.pk}/")
    shoot(phone, "job-detail-phone")
    phone.goto("/dashboard/jobs/")
    shoot(phone, "jobs-phone", full=False)
