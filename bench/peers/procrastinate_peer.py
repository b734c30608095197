"""Procrastinate (psycopg 3) under the same protocol as our engine.

Run as a script (``python bench/peers/procrastinate_peer.py worker ...``) it
is one Procrastinate worker process serving the no-op task ``ping``.
Procrastinate writes one ``procrastinate_events`` row per transition
(deferred, started, succeeded); those timestamps are what we read back.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import psycopg

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from peers import (  # noqa: E402
    BACKENDS_SQL,
    DRIVER_NAME,
    QueueSystem,
    WorkerGroup,
    dsn_for,
    ensure_database,
    python,
)

DATABASE = "bench_procrastinate"
QUEUE = "bench"


def make_app(dsn: str, application_name: str = "procrastinate-worker"):
    import procrastinate

    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(
            conninfo=dsn,
            kwargs={"application_name": application_name},
        )
    )

    @app.task(name="ping", queue=QUEUE)
    async def ping() -> None:
        return None

    return app, ping


class ProcrastinateSystem(QueueSystem):
    name = "procrastinate"

    def __init__(self, concurrency: int = 8, database: str = DATABASE) -> None:
        self.concurrency = concurrency  # Procrastinate's worker concurrency
        self.database = database
        self.dsn = dsn_for(database)
        self.loop = asyncio.new_event_loop()
        self.app = None
        self.ping = None
        self.sql: psycopg.Connection | None = None

    def _run(self, coro):
        return self.loop.run_until_complete(coro)

    def setup(self) -> None:
        ensure_database(self.database)
        self.sql = psycopg.connect(self.dsn, autocommit=True, application_name=DRIVER_NAME)
        self.app, self.ping = make_app(self.dsn, DRIVER_NAME)
        self._run(self.app.open_async())
        installed = self.sql.execute(
            "SELECT to_regclass('procrastinate_jobs') IS NOT NULL"
        ).fetchone()[0]
        if not installed:
            self._run(self.app.schema_manager.apply_schema_async())

    def reset(self) -> None:
        self.sql.execute(
            "TRUNCATE procrastinate_events, procrastinate_periodic_defers, procrastinate_jobs, "
            "procrastinate_workers CASCADE"
        )

    def enqueue_single(self, n: int) -> None:
        async def go():
            for _ in range(n):
                await self.ping.defer_async()

        self._run(go())

    def enqueue_bulk(self, n: int, chunk: int = 1000) -> None:
        async def go():
            for start in range(0, n, chunk):
                await self.ping.batch_defer_async(*([{}] * min(chunk, n - start)))

        self._run(go())

    def enqueue_for_drain(self, n: int) -> None:
        # What batch_defer runs, for all n jobs in one transaction.
        with self.sql.transaction():
            self.sql.execute(
                "SELECT procrastinate_defer_jobs_v1(array_agg("
                "ROW(%s, 'ping', 0, NULL, NULL, '{}'::jsonb, NULL)"
                "::procrastinate_job_to_defer_v1)) "
                "FROM generate_series(1, %s)",
                [QUEUE, n],
            )

    def worker_argvs(self, processes: int, concurrency: int, poll: float) -> list[list[str]]:
        return [
            [
                python(),
                str(Path(__file__).resolve()),
                "worker",
                "--dsn",
                self.dsn,
                "--concurrency",
                str(concurrency),
                "--poll",
                str(poll),
            ]
            for _ in range(processes)
        ]

    def workers_ready(self, group: WorkerGroup, processes: int) -> bool:
        return (
            self.sql.execute("SELECT count(*) FROM procrastinate_workers").fetchone()[0]
            >= processes
        )

    def backend_pids(self) -> list[int]:
        return [r[0] for r in self.sql.execute(BACKENDS_SQL).fetchall()]

    def succeeded_count(self) -> int:
        return self.sql.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
        ).fetchone()[0]

    def drain_window(self):
        return self.sql.execute(
            "SELECT count(*) FILTER (WHERE type = 'succeeded'), "
            "min(at) FILTER (WHERE type = 'started'), "
            "max(at) FILTER (WHERE type = 'succeeded') FROM procrastinate_events"
        ).fetchone()

    def enqueue_one(self) -> object:
        return self._run(self.ping.defer_async())

    def started_latency(self, handle: object) -> float | None:
        row = self.sql.execute(
            "SELECT extract(epoch FROM s.at - d.at) FROM procrastinate_events s "
            "JOIN procrastinate_events d ON d.job_id = s.job_id AND d.type = 'deferred' "
            "WHERE s.job_id = %s AND s.type = 'started'",
            [handle],
        ).fetchone()
        return float(row[0]) if row else None

    def finished(self, handle: object) -> bool:
        return bool(
            self.sql.execute(
                "SELECT 1 FROM procrastinate_jobs WHERE id = %s AND status = 'succeeded'", [handle]
            ).fetchone()
        )

    def close(self) -> None:
        if self.app is not None:
            self._run(self.app.close_async())
        if self.sql is not None:
            self.sql.close()
        self.loop.close()


# --- the worker process ----------------------------------------------------------


async def _serve(dsn: str, concurrency: int, poll: float) -> None:
    app, _ = make_app(dsn)
    async with app.open_async():
        await app.run_worker_async(
            queues=[QUEUE],
            concurrency=concurrency,
            fetch_job_polling_interval=poll,
            wait=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["worker"])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--poll", type=float, default=5.0)
    args = parser.parse_args()
    asyncio.run(_serve(args.dsn, args.concurrency, args.poll))


if __name__ == "__main__":
    main()
