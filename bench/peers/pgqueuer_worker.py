"""One PGQueuer worker process serving the no-op entrypoint ``ping``.

Two ways in, so a cold start can be timed the way each user would start it:

    python bench/peers/pgqueuer_worker.py --dsn DSN [--batch-size 10] [--poll 5]
    python bench/peers/pgqueuer_worker.py --dsn DSN --supervised

The second is what ``pgq run pgqueuer_worker:pgq_factory`` runs, through
PGQueuer's Python entry ``pgqueuer.run`` (its supervisor, signal handling and
factory protocol): the ``pgq`` command of PGQueuer 1.6.0 fails on its own
``--log-level`` default before it starts anything.

This module imports only asyncio, asyncpg and PGQueuer: the benchmark's own
helpers (psycopg among them) would add their import time to PGQueuer's start.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import asyncpg
from pgqueuer import AsyncpgDriver, Queries, QueueManager
from pgqueuer.models import Job

BATCH_SIZE = 10  # PGQueuer's default batch size


async def queue_manager(dsn: str) -> tuple[QueueManager, asyncpg.Connection]:
    conn = await asyncpg.connect(dsn)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))

    @qm.entrypoint("ping")
    async def ping(job: Job) -> None:
        return None

    return qm, conn


@asynccontextmanager
async def pgq_factory() -> AsyncIterator[QueueManager]:
    """The factory ``pgq run`` takes; the DSN comes from ``BENCH_PGQUEUER_DSN``."""
    qm, conn = await queue_manager(os.environ["BENCH_PGQUEUER_DSN"])
    try:
        yield qm
    finally:
        await conn.close()


async def serve(dsn: str, batch_size: int, poll: float, ready_file: str | None) -> None:
    qm, conn = await queue_manager(dsn)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, qm.shutdown.set)
    if ready_file:
        Path(ready_file).touch()
    try:
        await qm.run(dequeue_timeout=timedelta(seconds=poll), batch_size=batch_size)
    finally:
        await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    parser.add_argument("--poll", type=float, default=5.0)
    parser.add_argument("--ready-file", default=None)
    parser.add_argument("--supervised", action="store_true", help="as ``pgq run`` starts it")
    args = parser.parse_args()
    if args.supervised:
        import pgqueuer

        os.environ["BENCH_PGQUEUER_DSN"] = args.dsn
        asyncio.run(
            pgqueuer.run(
                pgq_factory,
                dequeue_timeout=timedelta(seconds=args.poll),
                batch_size=args.batch_size,
            )
        )
        return
    asyncio.run(serve(args.dsn, args.batch_size, args.poll, args.ready_file))


if __name__ == "__main__":
    main()
