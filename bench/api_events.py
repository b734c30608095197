"""Benchmark: GET /jobs/<id>/events?after=N on a big PostgreSQL database.

Fills a separate database (default ``bench_api``) with ``--jobs`` jobs and
``--events-per-job`` events each using ``generate_series`` (1M jobs and 10M
events by default), then times the events endpoint through Django's test
client with a real token: the whole stack (URL routing, token auth,
permission check, the index lookup, JSON rendering) but no socket. Prints
p50/p95 of each run and the medians over runs, and the selector's own time
(the database's share) for comparison.

    .venv/bin/python bench/api_events.py                          # 1M jobs, 10M events
    .venv/bin/python bench/api_events.py --jobs 100000 --runs 5   # quicker

The filled database is kept and reused on the next run with the same sizes
(``--refill`` to rebuild it, ``--drop`` to remove it afterwards).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs, urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--server",
        default="postgres://postgres@127.0.0.1:5432/postgres",
        help="A database URL on the PostgreSQL server (for CREATE DATABASE).",
    )
    parser.add_argument("--database", default="bench_api", help="The database to fill (created).")
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--events-per-job", type=int, default=10)
    parser.add_argument("--chunk", type=int, default=50_000, help="Jobs per INSERT statement.")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--requests", type=int, default=400, help="Requests per run.")
    parser.add_argument("--refill", action="store_true", help="Rebuild the data even if present.")
    parser.add_argument("--drop", action="store_true", help="Drop the database at the end.")
    return parser.parse_args()


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def libpq_url(url: str) -> str:
    return url.replace("postgres://", "postgresql://", 1)


def ensure_database(server_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(libpq_url(server_url), autocommit=True) as c:
        if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            print(f"creating database {name}", flush=True)
            c.execute(f'CREATE DATABASE "{name}"')


def drop_database(server_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(libpq_url(server_url), autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(f"dropped database {name}")


# Deterministic job ids: job number i has id md5(i)::uuid, so events can be
# generated for a range of jobs without reading the jobs back.
JOBS_SQL = """
INSERT INTO controlplane_job (
    id, operation, queue, payload, status, priority, run_after, expires_at, attempts,
    max_attempts, lease_requeues, parent_id, progress_current, progress_total, leased_until,
    lease_token, worker_id, result, error_code, error_message, created_at, started_at,
    finished_at, unique_key, last_event_seq, last_event_at
)
SELECT md5(i::text)::uuid, 'ping', 'q' || (i %% 8), '{}'::jsonb, 'succeeded', 0,
       ts, NULL, 1, 1, 0, NULL, 0, NULL, NULL, NULL, NULL, '{"pong": true}'::jsonb, '', '',
       ts, ts, ts + interval '1 second', NULL, %(events)s, ts + interval '1 second'
FROM (
    SELECT i, now() - (%(jobs)s - i) * interval '10 ms' AS ts
    FROM generate_series(%(start)s, %(stop)s) AS i
) AS numbered
"""

EVENTS_SQL = """
INSERT INTO controlplane_jobevent (job_id, seq, ts, event, level, message, fields)
SELECT md5(i::text)::uuid, s, now() - (%(jobs)s - i) * interval '10 ms' + s * interval '1 ms',
       CASE WHEN s = 1 THEN 'job.enqueued' ELSE 'bench.tick' END, 'info', '',
       jsonb_build_object('n', s)
FROM generate_series(%(start)s, %(stop)s) AS i CROSS JOIN generate_series(1, %(events)s) AS s
"""


def fill(jobs: int, events: int, chunk: int, refill: bool) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM controlplane_job")
        have_jobs = cursor.fetchone()[0]
        cursor.execute(
            "SELECT reltuples::bigint FROM pg_class WHERE relname = 'controlplane_jobevent'"
        )
        have_events = cursor.fetchone()[0]
        wanted = jobs * events
        if not refill and have_jobs == jobs and abs(have_events - wanted) <= wanted * 0.05:
            print(f"reusing {have_jobs:,} jobs and about {have_events:,} events", flush=True)
            return
        print(f"filling {jobs:,} jobs and {jobs * events:,} events", flush=True)
        cursor.execute("TRUNCATE controlplane_jobevent, controlplane_job CASCADE")
        cursor.execute("SET synchronous_commit = off")
        started = time.monotonic()
        for start in range(1, jobs + 1, chunk):
            stop = min(start + chunk - 1, jobs)
            params = {"start": start, "stop": stop, "jobs": jobs, "events": events}
            cursor.execute(JOBS_SQL, params)
            cursor.execute(EVENTS_SQL, params)
            elapsed = time.monotonic() - started
            print(
                f"  {stop:>10,} / {jobs:,} jobs  ({stop * events:,} events, {elapsed:,.0f} s)",
                flush=True,
            )
        print("  analyze", flush=True)
        cursor.execute("ANALYZE controlplane_job")
        cursor.execute("ANALYZE controlplane_jobevent")
        print(f"filled in {time.monotonic() - started:,.0f} s", flush=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def job_id(i: int) -> str:
    """The id the fill gave job number ``i`` (``md5(i::text)::uuid``), computed locally."""
    return str(uuid.UUID(hashlib.md5(str(i).encode()).hexdigest()))


def explain(sql: str, params: list) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", params)
        print("    " + "\n    ".join(row[0] for row in cursor.fetchall()), flush=True)


def timed_runs(label: str, client, headers, make_request, runs: int, requests: int) -> None:
    """``runs`` runs of ``requests`` calls; p50/p95 per run and their medians."""
    for _ in range(20):  # warm-up: connections, code paths (not the sampled rows)
        client.get(*make_request(), headers=headers)
    p50s, p95s = [], []
    for run in range(runs):
        timings = []
        for _ in range(requests):
            path, params = make_request()
            t0 = time.perf_counter()
            response = client.get(path, params, headers=headers)
            timings.append((time.perf_counter() - t0) * 1000)
            assert response.status_code == 200, response.content[:300]
        p50s.append(percentile(timings, 0.50))
        p95s.append(percentile(timings, 0.95))
        print(
            f"  {label:<34} run {run + 1}: p50 {p50s[-1]:.2f} ms  p95 {p95s[-1]:.2f} ms", flush=True
        )
    print(
        f"{label:<36} median of {runs} runs: p50 {statistics.median(p50s):.2f} ms  "
        f"p95 {statistics.median(p95s):.2f} ms  ({requests} requests per run)",
        flush=True,
    )


def measure(jobs: int, events: int, runs: int, requests: int) -> None:
    from django.contrib.auth.models import User
    from django.test import Client
    from rest_framework.authtoken.models import Token

    user = User.objects.filter(username="bench").first() or User.objects.create_superuser(
        "bench", "bench@example.com", None
    )
    token, _ = Token.objects.get_or_create(user=user)
    client = Client(SERVER_NAME="localhost")
    headers = {"Authorization": f"Token {token.key}"}
    rng = random.Random(42)

    def any_job() -> str:
        # Sampled over the whole table on every request, so most rows are cold:
        # not a few hundred warm ids.
        return job_id(rng.randint(1, jobs))

    print("plan of GET /jobs/<id>/events?after=N (a random job, after = half its timeline):")
    explain(
        "SELECT * FROM controlplane_jobevent WHERE job_id = %s AND seq > %s ORDER BY seq LIMIT 500",
        [any_job(), events // 2],
    )
    print("plan of GET /jobs (first page, no filter):")
    explain("SELECT * FROM controlplane_job ORDER BY created_at DESC, id DESC LIMIT 51", [])
    print("plan of GET /jobs?queue=q3&status=succeeded (first page):")
    explain(
        "SELECT * FROM controlplane_job WHERE queue IN ('q3') AND status IN ('succeeded') "
        "ORDER BY created_at DESC, id DESC LIMIT 51",
        [],
    )

    # The database's share: the selector alone (one index range scan), no HTTP.
    from jobs.selectors import job_events_after

    timings = []
    for _ in range(runs * requests):
        pk = any_job()
        t0 = time.perf_counter()
        job_events_after(uuid.UUID(pk), rng.randint(0, events), 500)
        timings.append((time.perf_counter() - t0) * 1000)
    print(
        f"{'selector only (no HTTP)':<36} p50 {percentile(timings, 0.5):.2f} ms  "
        f"p95 {percentile(timings, 0.95):.2f} ms  ({len(timings)} calls)",
        flush=True,
    )

    def events_after(after) -> Callable[[], tuple[str, dict]]:
        return lambda: (f"/jobs/{any_job()}/events", {"after": after()})

    first = client.get("/jobs", {"limit": 50}, headers=headers).json()
    deep_cursor = parse_qs(urlsplit(first["next"]).query)["cursor"][0]
    cases = {
        "events after=0 (whole timeline)": events_after(lambda: 0),
        "events after=random": events_after(lambda: rng.randint(0, events)),
        "events after=last (nothing new)": events_after(lambda: events),
        "jobs first page (counted)": lambda: ("/jobs", {"limit": 50}),
        "jobs filtered queue+status": lambda: (
            "/jobs",
            {"limit": 50, "queue": f"q{rng.randint(0, 7)}", "status": "succeeded"},
        ),
        "jobs created_before=random": lambda: (
            "/jobs",
            {"limit": 50, "count": "false", "created_before": f"{_random_time(rng, jobs)}"},
        ),
        "jobs next page (cursor)": lambda: ("/jobs", {"limit": 50, "cursor": deep_cursor}),
    }
    for label, make_request in cases.items():
        timed_runs(label, client, headers, make_request, runs, requests)


def _random_time(rng: random.Random, jobs: int) -> str:
    """A creation time inside the filled range (job i was created (jobs - i) * 10 ms ago)."""
    from datetime import UTC, datetime, timedelta

    ago = timedelta(milliseconds=10 * rng.randint(0, jobs))
    return (datetime.now(UTC) - ago).isoformat()


def main() -> None:
    args = parse_args()
    ensure_database(args.server, args.database)
    os.environ["DATABASE_URL"] = with_database(args.server, args.database)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    fill(args.jobs, args.events_per_job, args.chunk, args.refill)
    measure(args.jobs, args.events_per_job, args.runs, args.requests)
    if args.drop:
        from django.db import connections

        connections.close_all()
        drop_database(args.server, args.database)


if __name__ == "__main__":
    main()
