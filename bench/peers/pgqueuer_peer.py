"""PGQueuer (asyncpg) under the same protocol as our engine.

Its worker processes run ``pgqueuer_worker.py`` (the no-op entrypoint
``ping``), as a script or through ``pgq run``. PGQueuer logs every transition
(queued, picked, successful) in ``pgqueuer_log``; those timestamps are what
we read back.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from pathlib import Path

import psycopg

from peers import (
    BACKENDS_SQL,
    DRIVER_NAME,
    LOG_DIR,
    QueueSystem,
    WorkerGroup,
    dsn_for,
    ensure_database,
    python,
)

DATABASE = "bench_pgqueuer"
BATCH_SIZE = 10  # PGQueuer's default batch size
WORKER = Path(__file__).resolve().with_name("pgqueuer_worker.py")


class PGQueuerSystem(QueueSystem):
    name = "pgqueuer"
    cold_start = True

    def __init__(self, database: str = DATABASE, batch_size: int = BATCH_SIZE) -> None:
        self.database = database
        self.dsn = dsn_for(database)
        self.batch_size = batch_size
        self.concurrency = batch_size  # PGQueuer runs every picked job as an asyncio task
        self.loop = asyncio.new_event_loop()
        self.conn = None
        self.queries = None
        self.sql: psycopg.Connection | None = None

    def _run(self, coro):
        return self.loop.run_until_complete(coro)

    def setup(self) -> None:
        import asyncpg
        from pgqueuer import AsyncpgDriver, Queries

        ensure_database(self.database)
        self.conn = self._run(
            asyncpg.connect(self.dsn, server_settings={"application_name": DRIVER_NAME})
        )
        self.queries = Queries(AsyncpgDriver(self.conn))
        if not self._run(self.queries.has_table("pgqueuer")):
            self._run(self.queries.install())
        self.sql = psycopg.connect(self.dsn, autocommit=True, application_name=DRIVER_NAME)

    def reset(self) -> None:
        self.sql.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")

    def enqueue_single(self, n: int) -> None:
        async def go():
            for _ in range(n):
                await self.queries.enqueue("ping", None)

        self._run(go())

    async def _bulk(self, n: int, chunk: int) -> None:
        for start in range(0, n, chunk):
            size = min(chunk, n - start)
            await self.queries.enqueue(["ping"] * size, [None] * size, [0] * size)

    def enqueue_bulk(self, n: int, chunk: int = 1000) -> None:
        self._run(self._bulk(n, chunk))

    def enqueue_for_drain(self, n: int) -> None:
        async def go():
            async with self.conn.transaction():
                await self._bulk(n, 1000)

        self._run(go())

    def worker_argvs(self, processes: int, concurrency: int, poll: float) -> list[list[str]]:
        stamp = int(time.time() * 1000)
        self._ready_files = [LOG_DIR / f"pgqueuer-ready-{stamp}-{i}" for i in range(processes)]
        for f in self._ready_files:
            f.unlink(missing_ok=True)
        return [
            [
                python(),
                str(WORKER),
                "--dsn",
                self.dsn,
                "--batch-size",
                str(self.batch_size),
                "--poll",
                str(poll),
                "--ready-file",
                str(f),
            ]
            for f in self._ready_files
        ]

    def ready_variants(self, poll: float) -> dict[str, list[str] | None]:
        """The plain script, and the path ``pgq run`` takes (``pgqueuer_worker.py``)."""
        return {
            "": None,
            "pgq run": [
                python(),
                str(WORKER),
                "--dsn",
                self.dsn,
                "--batch-size",
                str(self.batch_size),
                "--poll",
                str(poll),
                "--supervised",
            ],
        }

    def workers_ready(self, group: WorkerGroup, processes: int) -> bool:
        return all(f.exists() for f in self._ready_files)

    def backend_pids(self) -> list[int]:
        return [r[0] for r in self.sql.execute(BACKENDS_SQL).fetchall()]

    def succeeded_count(self) -> int:
        return self.sql.execute(
            "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"
        ).fetchone()[0]

    def drain_window(self):
        return self.sql.execute(
            "SELECT count(*) FILTER (WHERE status = 'successful'), "
            "min(created) FILTER (WHERE status = 'picked'), "
            "max(created) FILTER (WHERE status = 'successful') FROM pgqueuer_log"
        ).fetchone()

    def first_started_at(self) -> datetime | None:
        return self.sql.execute(
            "SELECT min(created) FROM pgqueuer_log WHERE status = 'picked'"
        ).fetchone()[0]

    def enqueue_one(self) -> object:
        return self._run(self.queries.enqueue("ping", None))[0]

    def started_latency(self, handle: object) -> float | None:
        row = self.sql.execute(
            "SELECT extract(epoch FROM p.created - q.created) FROM pgqueuer_log p "
            "JOIN pgqueuer_log q ON q.job_id = p.job_id AND q.status = 'queued' "
            "WHERE p.job_id = %s AND p.status = 'picked'",
            [handle],
        ).fetchone()
        return float(row[0]) if row else None

    def finished(self, handle: object) -> bool:
        return bool(
            self.sql.execute(
                "SELECT 1 FROM pgqueuer_log WHERE job_id = %s AND status = 'successful'", [handle]
            ).fetchone()
        )

    def close(self) -> None:
        if self.conn is not None:
            self._run(self.conn.close())
        if self.sql is not None:
            self.sql.close()
        self.loop.close()
