"""Benchmark: dashboard page times on a PostgreSQL database with a million jobs.

Fills a separate database (default ``bench_dash``) with ``--jobs`` jobs and
three events for most of them using ``generate_series``: a week of history
at a steady rate (mostly succeeded, some failed and cancelled), a backlog in
one paused queue, a few hundred running jobs (some held by a dead worker),
reaper events in the last hour and one job with a long timeline, and the
metrics rollup of those jobs (minutes, folded quarters and hours). Then it
times every dashboard page through Django's test client logged in as an
operator (routing, session auth, the statement timeout, the queries and the
template rendering; no socket) and prints p50/p95 per page for each run and
the medians over runs.

    .venv/bin/python bench/dashboard_pages.py                      # 1M jobs
    .venv/bin/python bench/dashboard_pages.py --jobs 100000 --runs 3

The filled database is kept and reused on the next run with the same size
(``--refill`` rebuilds it, ``--drop`` removes it at the end).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

QUEUES = ["default", "emails", "reports", "billing", "exports", "media", "search", "webhooks"]
OPERATIONS = [
    "invoices.render",
    "emails.send",
    "reports.nightly",
    "embeddings.compute",
    "ping",
    "sleep",
]
BACKLOG_QUEUE = "exports"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--server",
        default="postgres://postgres@127.0.0.1:5432/postgres",
        help="A database URL on the PostgreSQL server (for CREATE DATABASE).",
    )
    parser.add_argument("--database", default="bench_dash", help="The database to fill (created).")
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--chunk", type=int, default=100_000, help="Jobs per INSERT statement.")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--requests", type=int, default=20, help="Requests per page per run.")
    parser.add_argument("--refill", action="store_true", help="Rebuild the data even if present.")
    parser.add_argument("--drop", action="store_true", help="Drop the database at the end.")
    parser.add_argument("--json", help="Also write the results to this file.")
    parser.add_argument(
        "--payload-index",
        action="store_true",
        help="Time with a GIN (jsonb_path_ops) index on controlplane_job.payload, "
        "created for the run and dropped after it.",
    )
    return parser.parse_args()


def with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


def ensure_database(args: argparse.Namespace) -> None:
    import psycopg

    with psycopg.connect(args.server, autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [args.database]
        ).fetchone()
        if exists and args.refill:
            conn.execute(f'DROP DATABASE "{args.database}" WITH (FORCE)')
            exists = None
        if not exists:
            conn.execute(f'CREATE DATABASE "{args.database}"')


def drop_database(args: argparse.Namespace) -> None:
    import psycopg
    from django.db import connections

    connections.close_all()
    with psycopg.connect(args.server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)')


# --- the data --------------------------------------------------------------------

JOBS_SQL = """
INSERT INTO controlplane_job (
    id, operation, queue, payload, status, priority, run_after, attempts, max_attempts,
    lease_requeues, progress_current, progress_total, leased_until, lease_token, worker_id,
    result, error_code, error_message, created_at, started_at, finished_at,
    last_event_seq, last_event_at)
SELECT
    gen_random_uuid(), op, queue, jsonb_build_object('account', i %% 5000, 'region', region),
    status, 0, created, CASE WHEN status = 'queued' THEN 0 ELSE 1 END, 3, 0, 0, NULL,
    CASE WHEN status = 'running' THEN now() + interval '5 min' END,
    CASE WHEN status = 'running' THEN gen_random_uuid() END,
    CASE WHEN status = 'running' THEN (CASE WHEN i %% 4 = 0 THEN %(dead)s ELSE %(alive)s END)::uuid
         WHEN status = 'queued' THEN NULL ELSE %(alive)s::uuid END,
    CASE WHEN status = 'succeeded' THEN '{"ok": true}'::jsonb END,
    CASE WHEN status = 'failed'
         THEN (ARRAY['TimeoutError', 'SMTPServerDisconnected', 'KeyError'])[1 + i %% 3]
         ELSE '' END,
    CASE WHEN status = 'failed'
         THEN 'upstream did not answer within 30 s (request ' || i || ')'
         ELSE '' END,
    created,
    CASE WHEN status <> 'queued' THEN created + interval '1 s' END,
    CASE WHEN status IN ('succeeded', 'failed', 'cancelled') THEN created + interval '3 s' END,
    CASE WHEN status = 'queued' THEN 1 WHEN status = 'running' THEN 2 ELSE 3 END,
    created
FROM (
    SELECT i, op, queue, region, created,
        CASE
            WHEN i <= 2000 THEN 'queued'
            WHEN i <= 2300 THEN 'running'
            WHEN queue = %(backlog)s AND i <= %(backlog_until)s THEN 'queued'
            WHEN r < 0.95 THEN 'succeeded'
            WHEN r < 0.99 THEN 'failed'
            ELSE 'cancelled'
        END AS status
    FROM (
        SELECT i, random() AS r,
            (%(ops)s::text[])[1 + i %% 6] AS op,
            (%(queues)s::text[])[1 + (i / 7) %% 8] AS queue,
            (ARRAY['eu', 'us', 'ap'])[1 + i %% 3] AS region,
            now() - i * %(spacing)s * interval '1 second' AS created
        FROM generate_series(%(first)s, %(last)s) AS i
    ) AS raw
) AS jobs
"""

EVENTS_SQL = """
INSERT INTO controlplane_jobevent (job_id, seq, ts, event, level, message, fields)
SELECT j.id, s.seq, j.created_at + s.seq * interval '1 second',
    CASE s.seq WHEN 1 THEN 'job.enqueued' WHEN 2 THEN 'job.started' ELSE 'job.' || j.status END,
    CASE WHEN s.seq = 3 AND j.status = 'failed' THEN 'error' ELSE 'info' END,
    CASE WHEN s.seq = 3 AND j.status = 'failed' THEN j.error_message ELSE '' END,
    '{}'::jsonb
FROM controlplane_job j CROSS JOIN LATERAL generate_series(1, j.last_event_seq) AS s(seq)
WHERE j.created_at <= %(upper)s AND j.created_at > %(lower)s
"""


def fill(args: argparse.Namespace) -> dict:
    """Fill the database unless it already holds ``--jobs`` jobs; return ids the pages need."""
    from django.contrib.auth.models import User
    from django.db import connection
    from django.utils import timezone

    from jobs.models import Job, Queue, Worker

    count = Job.objects.count()
    if count != args.jobs or args.refill:
        started = time.perf_counter()
        with connection.cursor() as cursor:
            cursor.execute(
                "TRUNCATE controlplane_jobevent, controlplane_job, controlplane_worker, "
                "controlplane_queue CASCADE"
            )
        now = timezone.now()
        alive = Worker.objects.create(
            hostname="bench-worker-1", pid=1, queues=QUEUES, concurrency=16
        )
        dead = Worker.objects.create(
            hostname="bench-worker-2",
            pid=2,
            queues=QUEUES,
            concurrency=16,
            last_heartbeat=now - timedelta(hours=2),
        )
        spacing = 7 * 24 * 3600 / args.jobs  # a week of history
        params = {
            "alive": str(alive.pk),
            "dead": str(dead.pk),
            "backlog": BACKLOG_QUEUE,
            "backlog_until": args.jobs // 10,
            "ops": OPERATIONS,
            "queues": QUEUES,
            "spacing": spacing,
        }
        with connection.cursor() as cursor:
            for first in range(1, args.jobs + 1, args.chunk):
                last = min(first + args.chunk - 1, args.jobs)
                cursor.execute(JOBS_SQL, {**params, "first": first, "last": last})
                print(f"  jobs {last:,}/{args.jobs:,}", flush=True)
            bounds = (
                [now - timedelta(days=8)]
                + [now - timedelta(days=d) for d in range(6, -1, -1)]
                + [now + timedelta(days=1)]
            )
            for lower, upper in zip(bounds, bounds[1:], strict=False):
                cursor.execute(EVENTS_SQL, {"lower": lower, "upper": upper})
            print("  events written", flush=True)
            # One job with a long timeline, and reaper activity in the last hour.
            hot = Job.objects.filter(status="running").order_by("-created_at").first()
            cursor.execute(
                "INSERT INTO controlplane_jobevent "
                "(job_id, seq, ts, event, level, message, fields) "
                "SELECT %s, 2 + s, now() - (5000 - s) * interval '10 ms', 'sleep.tick', 'info', "
                "'step ' || s, "
                "jsonb_build_object('_progress_current', s, '_progress_total', 10000) "
                "FROM generate_series(1, 5000) AS s",
                [hot.pk],
            )
            Job.objects.filter(pk=hot.pk).update(
                last_event_seq=5002, progress_current=5000, progress_total=10000
            )
            cursor.execute(
                "INSERT INTO controlplane_jobevent "
                "(job_id, seq, ts, event, level, message, fields) "
                "SELECT id, last_event_seq + 1, now() - (random() * interval '50 min'), "
                "'job.lease_expired_requeue', 'warning', 'lease expired; requeued', '{}'::jsonb "
                "FROM controlplane_job WHERE status = 'succeeded' "
                "AND created_at > now() - interval '2 hours' LIMIT 300"
            )
        Queue.objects.create(name=BACKLOG_QUEUE, paused=True)
        Queue.objects.create(name="emails", concurrency_cap=20)
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE controlplane_job")
            cursor.execute("VACUUM ANALYZE controlplane_jobevent")
        print(f"  filled in {time.perf_counter() - started:.0f} s", flush=True)
    fill_metrics()
    user, _ = User.objects.get_or_create(username="bench-operator", defaults={"is_superuser": True})
    running = Job.objects.filter(status="running").order_by("-created_at").first()
    finished = Job.objects.filter(status="failed").order_by("-created_at").first()
    return {"user": user, "running": running.pk, "finished": finished.pk}


def fill_metrics() -> None:
    """The metrics rollup of those jobs, as the reaper would have written it, and its spans.

    One row per minute, queue and operation with a start (about 480,000 rows for a
    week of a million jobs over 48 pairs): a wait of 1 s and a run of 2 s each, the
    fill's own timings. Then quarters and hours are folded as the reaper's passes would.
    """
    from django.db import connection
    from django.utils import timezone

    from jobs.metrics.spans import fold_metric_spans
    from jobs.models import Job, JobEvent, MetricRollup, MetricSpan

    if MetricRollup.objects.exists():
        return
    started = time.perf_counter()
    wait = ", ".join("count(*)" if i == 7 else "0" for i in range(19))  # (0.5 s, 1 s]
    run = ", ".join("count(*)" if i == 8 else "0" for i in range(19))  # (1 s, 2.5 s]
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {MetricRollup._meta.db_table} (minute, queue, operation, started, "
            "succeeded, failed, retried, cancelled, lease_expiries, rescues, "
            "wait_bucket_counts, wait_sum, run_bucket_counts, run_sum) "
            "SELECT date_trunc('minute', started_at), queue, operation, count(*), "
            "count(*) FILTER (WHERE status = 'succeeded'), "
            "count(*) FILTER (WHERE status = 'failed'), 0, 0, 0, 0, "
            f"jsonb_build_array({wait}), count(*) * 1.0, jsonb_build_array({run}), count(*) * 2.0 "
            f"FROM {Job._meta.db_table} WHERE started_at IS NOT NULL GROUP BY 1, 2, 3"
        )
        cursor.execute(f"VACUUM ANALYZE {MetricRollup._meta.db_table}")
    last = JobEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0
    while fold_metric_spans(cutoff=timezone.now(), read_upto=last):
        pass
    print(
        f"  metrics: {MetricRollup.objects.count():,} minute rows, "
        f"{MetricSpan.objects.count():,} quarter and hour rows in "
        f"{time.perf_counter() - started:.0f} s",
        flush=True,
    )


# --- timing --------------------------------------------------------------------------


def pages(ids: dict) -> list[tuple[str, str]]:
    from dashboard.filters import JobFilters
    from dashboard.selectors import job_page

    cursor = ""
    for _ in range(20):  # the cursor of page 21, walked as the "Older" link does
        cursor = job_page(JobFilters(), after=cursor).next_cursor or ""
    deep = f"/dashboard/jobs/?after={cursor}"
    return [
        ("overview", "/dashboard/"),
        ("overview (live fragment)", "/dashboard/?live=1"),
        ("jobs, newest", "/dashboard/jobs/"),
        ("jobs, page 21", deep),
        ("jobs, status=failed", "/dashboard/jobs/?status=failed"),
        ("jobs, queue+status", f"/dashboard/jobs/?queue={BACKLOG_QUEUE}&status=queued"),
        ("jobs, payload contains", "/dashboard/jobs/?payload=" + quote('{"account": 42}')),
        ("  its count (payload)", "/dashboard/jobs/count/?payload=" + quote('{"account": 42}')),
        ("jobs, text search", "/dashboard/jobs/?q=SMTPServer&range=24h"),
        ("  its count (text)", "/dashboard/jobs/count/?q=SMTPServer&range=24h"),
        ("jobs count, unfiltered", "/dashboard/jobs/count/"),
        ("job detail (5,000 events)", f"/dashboard/jobs/{ids['running']}/"),
        ("job detail (failed)", f"/dashboard/jobs/{ids['finished']}/"),
        ("job live poll", f"/dashboard/jobs/{ids['running']}/live/?after=5000"),
        ("workers", "/dashboard/workers/"),
        ("queues", "/dashboard/queues/"),
        ("queues, charts of 30 d", "/dashboard/queues/?window=30d"),
        ("metrics, 1 h", "/dashboard/metrics/?window=1h"),
        ("metrics, 24 h", "/dashboard/metrics/?window=24h"),
        ("metrics, 7 d", "/dashboard/metrics/?window=7d"),
        ("metrics, 30 d", "/dashboard/metrics/?window=30d"),
        ("metrics, 30 d, one queue", "/dashboard/metrics/?window=30d&queue=emails"),
    ]


def time_page(client, path: str, n: int) -> tuple[list[float], int]:
    times, status = [], 200
    for _ in range(n):
        started = time.perf_counter()
        response = client.get(path)
        times.append((time.perf_counter() - started) * 1000)
        status = response.status_code if response.status_code != 200 else status
    return times, status


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def main() -> None:
    args = parse_args()
    os.environ["DATABASE_URL"] = with_database(args.server, args.database)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    ensure_database(args)
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.test import Client
    from django.utils import timezone

    # The test client's host; not setup_test_environment(), whose template
    # instrumentation would be timed too.
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    call_command("migrate", verbosity=0)
    print(f"Database {args.database}: {args.jobs:,} jobs", flush=True)
    ids = fill(args)
    if args.payload_index:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(
                "CREATE INDEX IF NOT EXISTS bench_payload_gin ON controlplane_job "
                "USING gin (payload jsonb_path_ops)"
            )
        print("  with a GIN index on controlplane_job.payload", flush=True)
    client = Client()
    client.force_login(ids["user"])
    targets = pages(ids)
    for _, path in targets:  # warm caches and connections
        client.get(path)
    results: dict[str, dict[str, list[float]]] = {
        name: {"p50": [], "p95": []} for name, _ in targets
    }
    statuses: dict[str, int] = {}
    from jobs.models import Worker

    for run in range(1, args.runs + 1):
        print(f"\nrun {run}/{args.runs}")
        # The live worker keeps beating; the other one stays dead (its jobs are orphans).
        Worker.objects.filter(hostname="bench-worker-1").update(last_heartbeat=timezone.now())
        for name, path in targets:
            times, status = time_page(client, path, args.requests)
            statuses[name] = status
            p50, p95 = percentile(times, 0.5), percentile(times, 0.95)
            results[name]["p50"].append(p50)
            results[name]["p95"].append(p95)
            print(f"  {name:<28} p50 {p50:8.1f} ms   p95 {p95:8.1f} ms   HTTP {status}")
    print(
        f"\nMedians over {args.runs} runs of {args.requests} requests per page "
        f"({args.jobs:,} jobs, PostgreSQL):"
    )
    print(f"  {'page':<28} {'p50 ms':>9} {'p95 ms':>9}")
    summary = {}
    for name, _ in targets:
        p50 = statistics.median(results[name]["p50"])
        p95 = statistics.median(results[name]["p95"])
        summary[name] = {"p50_ms": round(p50, 1), "p95_ms": round(p95, 1), "status": statuses[name]}
        print(
            f"  {name:<28} {p50:9.1f} {p95:9.1f}"
            + ("" if statuses[name] == 200 else f"  HTTP {statuses[name]}")
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"jobs": args.jobs, "runs": args.runs, "requests": args.requests, "pages": summary},
                indent=2,
            )
        )
    if args.payload_index:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("DROP INDEX IF EXISTS bench_payload_gin")
    if args.drop:
        drop_database(args)


if __name__ == "__main__":
    main()
