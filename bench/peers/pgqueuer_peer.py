"""PGQueuer (asyncpg) under the same protocol as our engine.

Run as a script (``python bench/peers/pgqueuer_peer.py worker ...``) it is
one PGQueuer worker process serving the no-op entrypoint ``ping``. PGQueuer
logs every transition (queued, picked, successful) in ``pgqueuer_log``;
those timestamps are what we read back.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import psycopg

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from peers import (  # noqa: E402
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


class PGQueuerSystem(QueueSystem):
    name = "pgqueuer"

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
                str(Path(__file__).resolve()),
                "worker",
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


# --- the worker process ----------------------------------------------------------


async def _serve(dsn: str, batch_size: int, poll: float, ready_file: str) -> None:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries, QueueManager
    from pgqueuer.models import Job

    conn = await asyncpg.connect(dsn)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))

    @qm.entrypoint("ping")
    async def ping(job: Job) -> None:
        return None

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, qm.shutdown.set)
    Path(ready_file).touch()
    await qm.run(dequeue_timeout=timedelta(seconds=poll), batch_size=batch_size)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["worker"])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    parser.add_argument("--poll", type=float, default=5.0)
    parser.add_argument("--ready-file", required=True)
    args = parser.parse_args()
    asyncio.run(_serve(args.dsn, args.batch_size, args.poll, args.ready_file))


if __name__ == "__main__":
    main()
