"""Issue 32's rows measured the way a user runs the product, beside PGQueuer in the same run.

    .venv/bin/python bench/user_path.py [--rounds 3] [--phases drain,enqueue,longpoll]
                                        [--jobs 20000] [--long-polls 1000] [--wait 5]

Everything runs in a fresh ``startproject`` with the README's recipe
(``bench/host_project.py``), its bytecode compiled, on a fresh database
``bench_user_path`` (PGQueuer's: ``bench_user_path_pgqueuer``), from ``--checkout`` (default: this
one):

- **drain**: ``--jobs`` ``ping`` jobs go in through ``POST /jobs`` against
  ``manage.py serve`` (8 keep-alive clients), then 2 separate
  ``manage.py runworker --queue Q --burst --concurrency 32`` execs drain them
  and exit. Rate = jobs / (first ``started_at`` → last ``finished_at``); beside
  it the wall time from the execs to their exit. PGQueuer: the same number of
  jobs through its bulk enqueue, then 2 workers started the way ``pgq run``
  starts them (``peers/pgqueuer_worker.py --supervised``); rate from its log
  (first ``picked`` → last ``successful``). Rounds alternate the order (ABBA).
- **enqueue**: in a child process of the host project, ``jobs.enqueue.enqueue("ping")``
  2,000 times, then ``enqueue_many`` in calls of 1,000 (20,000 jobs); PGQueuer's
  single and bulk enqueue beside it, in the same order.
- **longpoll**: ``--long-polls`` registered remote workers each send
  ``POST /workers/<id>/claim {"wait": W}`` at once over connections opened
  beforehand; one job is enqueued 2 s later. Every answer's latency is taken
  at the client, from its request's write to its response's last byte. The
  same client against a reference server that answers each request exactly
  ``W`` s after reading it says what the client itself adds.

Medians over rounds are printed with every round's figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import psycopg  # noqa: E402
import web  # noqa: E402  (bench/web.py: the host project, servers, processes)
from engine import PACKAGES  # noqa: E402
from flow_keys import SITECUSTOMIZE  # noqa: E402  (drops the editable install's finders)
from peers import ADMIN_DSN, cpu_seconds, descendants, dsn_for, ensure_database  # noqa: E402
from peers.pgqueuer_peer import WORKER as PGQ_WORKER  # noqa: E402
from peers.pgqueuer_peer import PGQueuerSystem  # noqa: E402

DATABASE = "bench_user_path"
QUEUE = "up"
USER, PASSWORD = "bench", "bench-password-1"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--phases", default="drain,enqueue,longpoll")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--single", type=int, default=2_000)
    parser.add_argument("--long-polls", type=int, default=1_000)
    parser.add_argument("--wait", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument(
        "--fills",
        default="post",
        help="How the drain's jobs go in, a comma-separated list of variants measured in turn: "
        "post (POST /jobs, the issue's way), bulk (enqueue_many in one transaction, "
        "bench/engine.py's way), bulk-analyzed (the same, then ANALYZE), single (enqueue() in a "
        "loop, each job its own transaction).",
    )
    parser.add_argument(
        "--checkout",
        type=Path,
        default=ROOT,
        help="The checkout the host project runs (a git worktree: its code wins over the "
        "editable install's).",
    )
    parser.add_argument("--no-peer", action="store_true", help="Drain ours only.")
    return parser.parse_args()


class Host:
    """The host project: its directory, its environment, ``manage.py`` and the server."""

    def __init__(self, logs: Path, checkout: Path) -> None:
        self.logs = logs
        self.database_url = dsn_for(DATABASE).replace("postgresql://", "postgres://")
        ensure_database(DATABASE, fresh=True)
        web.use_host_project(logs / "host")
        self.directory = web.PROJECT.directory
        self.env = web.child_env(self.database_url, logs / "static")
        self.env["DJANGO_SETTINGS_MODULE"] = web.PROJECT.settings
        site = logs / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
        self.env["PYTHONPATH"] = os.pathsep.join([str(site), str(checkout)])
        self.manage(["migrate", "--verbosity", "0"])
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", *[str(checkout / p) for p in PACKAGES]],
            check=True,
            env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
        )
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", str(self.directory)],
            check=True,
            env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
        )
        self.token = self.python(TOKEN_SCRIPT).strip().splitlines()[-1]
        print("the host project imports", self.python("import jobs; print(jobs.__file__)"))
        port = web.free_port()  # ``serve`` as a user starts it: its defaults (a process per core)
        argv = [sys.executable, "manage.py", "serve", "--port", str(port)]
        self.server = web.start_server("manage.py serve", argv, self.env, logs, port, 2)
        self.sql = psycopg.connect(dsn_for(DATABASE), autocommit=True)

    def manage(self, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "manage.py", *argv],
            cwd=self.directory,
            env=self.env,
            check=True,
            capture_output=True,
            text=True,
            **kwargs,
        )

    def python(self, script: str) -> str:
        """Run ``script`` after ``django.setup()`` in the host project; its stdout."""
        done = subprocess.run(
            [sys.executable, "-c", SETUP + script],
            cwd=self.directory,
            env=self.env,
            check=True,
            capture_output=True,
            text=True,
        )
        return done.stdout

    def reset(self) -> None:
        self.sql.execute("TRUNCATE controlplane_job CASCADE")
        self.sql.execute("VACUUM ANALYZE controlplane_job")


SETUP = """
import sys, time, django
sys.path.insert(0, ".")
django.setup()
"""

TOKEN_SCRIPT = f"""
from django.contrib.auth.models import User
from rest_framework.authtoken.models import Token
user = User.objects.filter(username={USER!r}).first() or User.objects.create_superuser(
    {USER!r}, "bench@example.com", {PASSWORD!r})
print(Token.objects.get_or_create(user=user)[0].key)
"""

ENQUEUE_SCRIPT = """
from jobs.enqueue import JobSpec, enqueue, enqueue_many
for _ in range(50):
    enqueue("ping", queue="warm")
started = time.perf_counter()
for _ in range({single}):
    enqueue("ping", queue="up-single")
single = {single} / (time.perf_counter() - started)
started = time.perf_counter()
for _ in range({bulk} // 1000):
    enqueue_many([JobSpec(operation="ping", queue="up-bulk") for _ in range(1000)])
bulk = {bulk} / (time.perf_counter() - started)
print(single, bulk)
"""

BULK_FILL = """
from django.db import transaction
from jobs.enqueue import JobSpec, enqueue_many
with transaction.atomic():
    for _ in range({jobs} // 1000):
        enqueue_many([JobSpec(operation="ping", queue={queue!r}) for _ in range(1000)])
"""

SINGLE_FILL = """
from jobs.enqueue import enqueue
for _ in range({jobs}):
    enqueue("ping", queue={queue!r})
"""


# --- drain ---------------------------------------------------------------------------


def post_jobs(host: Host, n: int) -> float:
    """``n`` pings through ``POST /jobs`` (8 keep-alive clients); the rate."""
    import httpx

    body = {"operation": "ping", "queue": QUEUE}
    headers = {"Authorization": f"Token {host.token}"}

    def client(count: int) -> None:
        with httpx.Client(base_url=host.server.url, headers=headers, trust_env=False) as api:
            for _ in range(count):
                api.post("/jobs", json=body).raise_for_status()

    started = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(client, [n // 8 + (i < n % 8) for i in range(8)]))
    return n / (time.perf_counter() - started)


def drain_ours(host: Host, args: argparse.Namespace, fill: str) -> dict[str, float]:
    host.reset()
    if fill == "post":
        enqueue_rate = post_jobs(host, args.jobs)
    else:
        started = time.perf_counter()
        script = SINGLE_FILL if fill == "single" else BULK_FILL
        host.python(script.format(jobs=args.jobs, queue=QUEUE))
        enqueue_rate = args.jobs / (time.perf_counter() - started)
    if fill == "bulk-analyzed":
        host.sql.execute("ANALYZE controlplane_job")
    argv = [sys.executable, "manage.py", "runworker", "--queue", QUEUE, "--burst"]
    argv += ["--concurrency", str(args.concurrency)]
    server_pids = descendants(host.server.popen.pid)
    server_cpu = sum(cpu_seconds(pid) for pid in server_pids)
    started = time.perf_counter()
    workers = [
        web.start(argv, host.env, host.logs / "runworker.log") for _ in range(args.processes)
    ]
    for worker in workers:
        worker.wait(600)
        web.stop(worker)
    wall = time.perf_counter() - started
    done, first, last = host.sql.execute(
        "SELECT count(*) FILTER (WHERE status = 'succeeded'), min(started_at), max(finished_at) "
        "FROM controlplane_job WHERE queue = %s",
        [QUEUE],
    ).fetchone()
    if done != args.jobs:
        raise RuntimeError(f"drain: {done} of {args.jobs} succeeded; see {host.logs}")
    return {
        "rate": done / (last - first).total_seconds(),
        "wall": done / wall,
        "post": enqueue_rate,
        "serve_cpu_ms": (sum(cpu_seconds(pid) for pid in server_pids) - server_cpu) * 1000,
    }


def drain_pgqueuer(pgq: PGQueuerSystem, args: argparse.Namespace, logs: Path) -> dict[str, float]:
    pgq.reset()
    pgq.sql.execute("VACUUM ANALYZE pgqueuer")
    pgq.enqueue_for_drain(args.jobs)
    argv = [sys.executable, str(PGQ_WORKER), "--dsn", pgq.dsn, "--supervised"]
    started = time.perf_counter()
    workers = [web.start(argv, dict(os.environ), logs / "pgq.log") for _ in range(args.processes)]
    deadline = time.monotonic() + 600
    while pgq.succeeded_count() < args.jobs:
        if time.monotonic() > deadline:
            raise RuntimeError("PGQueuer did not drain")
        time.sleep(0.05)
    wall = time.perf_counter() - started
    for worker in workers:
        web.stop(worker)
    done, first, last = pgq.drain_window()
    return {"rate": done / (last - first).total_seconds(), "wall": done / wall}


# --- long-polls ----------------------------------------------------------------------


async def read_body(reader: asyncio.StreamReader, head: bytes) -> bytes:
    """The body after ``head``: by its Content-Length, or chunked."""
    lines = head.lower().split(b"\r\n")
    for line in lines:
        if line.startswith(b"content-length:"):
            return await reader.readexactly(int(line.split(b":", 1)[1]))
    if b"transfer-encoding: chunked" not in lines:
        raise RuntimeError(f"no length in {head!r}")
    body = b""
    while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
        body += (await reader.readexactly(size + 2))[:-2]
    await reader.readuntil(b"\r\n")
    return body


async def long_poll_client(
    port: int, path_of: list[str], headers: str, body: bytes, on_sent, preopen: bool = True
) -> list[tuple[float, int]]:
    """Send every request at once; (latency s, status) each.

    ``preopen``: the connections are opened first and each latency counts from its
    request's write; otherwise every request connects at once and counts from its connect.
    """
    conns: list = [None] * len(path_of)
    if preopen:
        conns = []
        for start in range(0, len(path_of), 100):
            conns += await asyncio.gather(
                *(asyncio.open_connection("127.0.0.1", port) for _ in path_of[start : start + 100])
            )

    async def one(conn, path: str) -> tuple[float, int]:
        started = time.perf_counter()
        reader, writer = conn or await asyncio.open_connection("127.0.0.1", port)
        request = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        writer.write(request)
        if conn:
            started = time.perf_counter()
        head = await reader.readuntil(b"\r\n\r\n")
        await read_body(reader, head)
        took = time.perf_counter() - started
        writer.close()
        return took, int(head.split(b" ", 2)[1])

    tasks = [
        asyncio.create_task(one(conn, path)) for conn, path in zip(conns, path_of, strict=True)
    ]
    on_sent()
    return await asyncio.gather(*tasks)


async def reference_server(wait: float) -> asyncio.Server:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        await read_body(reader, head)
        await asyncio.sleep(wait)
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n{"jobs": []}')
        await writer.drain()
        writer.close()

    return await asyncio.start_server(answer, "127.0.0.1", 0, backlog=4096)


def summarise(results: list[tuple[float, int]], wait: float) -> dict[str, float]:
    took = sorted(t for t, _ in results)
    return {
        "n": len(took),
        "max": took[-1],
        "p99": took[int(0.99 * (len(took) - 1))],
        "p50": took[len(took) // 2],
        "late": sum(t > wait + 0.5 for t in took),
        "non200": sum(s != 200 for _, s in results),
        "statuses": dict(Counter(s for _, s in results)),
    }


def long_polls_reference(args: argparse.Namespace, preopen: bool) -> dict[str, float]:
    async def go():
        server = await reference_server(args.wait)
        port = server.sockets[0].getsockname()[1]
        results = await long_poll_client(
            port, ["/claim"] * args.long_polls, "", b'{"wait": 5}', lambda: None, preopen
        )
        server.close()
        return results

    return summarise(asyncio.run(go()), args.wait)


def register_workers(host: Host, n: int) -> list[str]:
    import httpx

    headers = {"Authorization": f"Token {host.token}"}
    with httpx.Client(base_url=host.server.url, headers=headers, trust_env=False) as api:
        return [
            api.post(
                "/workers",
                json={"name": f"lp-{i}", "operations": [{"name": "bench.lp", "queue": "up-lp"}]},
            ).json()["id"]
            for i in range(n)
        ]


def long_polls_ours(
    host: Host, workers: list[str], args: argparse.Namespace, preopen: bool
) -> dict[str, float]:
    import threading

    import httpx

    prefix = web.PROJECT.prefix
    port = int(host.server.url.split(":")[2].split("/")[0])
    body = json.dumps({"limit": 1, "wait": args.wait}).encode()
    headers = f"Authorization: Token {host.token}\r\n"

    def enqueue_later() -> None:
        time.sleep(2)
        with httpx.Client(base_url=host.server.url, trust_env=False) as api:
            api.post(
                "/jobs",
                json={"operation": "bench.lp", "queue": "up-lp"},
                headers={"Authorization": f"Token {host.token}"},
            ).raise_for_status()

    paths = [f"{prefix}/workers/{w}/claim" for w in workers]
    server_pids = descendants(host.server.popen.pid)
    cpu_before = sum(cpu_seconds(pid) for pid in server_pids)
    results = asyncio.run(
        long_poll_client(
            port,
            paths,
            headers,
            body,
            lambda: threading.Thread(target=enqueue_later).start(),
            preopen,
        )
    )
    summary = summarise(results, args.wait)
    summary["cpu_ms"] = (sum(cpu_seconds(p) for p in server_pids) - cpu_before) * 1000 / len(paths)
    return summary


# --- main ----------------------------------------------------------------------------


def med(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main() -> None:
    args = parse_args()
    phases = set(args.phases.split(","))
    web.raise_file_limit()
    logs = Path(tempfile.mkdtemp(prefix="bench-user-path-"))
    print(f"logs in {logs}; PostgreSQL {ADMIN_DSN}", flush=True)
    host = Host(logs, args.checkout.resolve())
    pgq = PGQueuerSystem(f"{DATABASE}_pgqueuer")
    ensure_database(pgq.database, fresh=True)
    pgq.setup()
    try:
        if "drain" in phases:
            fills = args.fills.split(",")
            sides = fills + ([] if args.no_peer else ["PGQueuer"])
            drains: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
            for r in range(args.rounds):
                for side in sides if r % 2 == 0 else sides[::-1]:
                    if side == "PGQueuer":
                        drains[side].append(drain_pgqueuer(pgq, args, logs))
                    else:
                        drains[side].append(drain_ours(host, args, side))
                    figures = ", ".join(f"{k} {v:,.0f}" for k, v in drains[side][-1].items())
                    print(f"  round {r + 1} {side}: {figures}  ({web.load()})", flush=True)
            for side in sides:
                runs = drains[side]
                line = (
                    f"drain {side}: {med(runs, 'rate'):,.0f} jobs/s (wall {med(runs, 'wall'):,.0f})"
                )
                if side != "PGQueuer" and not args.no_peer:
                    theirs = drains["PGQueuer"]
                    line += (
                        f"; / PGQueuer {med(runs, 'rate') / med(theirs, 'rate'):.2f} on the "
                        "medians, per round "
                        + ", ".join(
                            f"{o['rate'] / t['rate']:.2f}"
                            for o, t in zip(runs, theirs, strict=True)
                        )
                        + f"; wall {med(runs, 'wall') / med(theirs, 'wall'):.2f}"
                    )
                print(line, flush=True)
        if "enqueue" in phases:
            ours, theirs = [], []
            for r in range(args.rounds):
                order = ["ours", "pgq"] if r % 2 == 0 else ["pgq", "ours"]
                for who in order:
                    if who == "ours":
                        host.reset()
                        out = host.python(ENQUEUE_SCRIPT.format(single=args.single, bulk=args.jobs))
                        single, bulk = map(float, out.split()[-2:])
                        ours.append({"single": single, "bulk": bulk})
                    else:
                        pgq.reset()
                        pgq.enqueue_single(50)
                        started = time.perf_counter()
                        pgq.enqueue_single(args.single)
                        single = args.single / (time.perf_counter() - started)
                        started = time.perf_counter()
                        pgq.enqueue_bulk(args.jobs, 1000)
                        theirs.append(
                            {"single": single, "bulk": args.jobs / (time.perf_counter() - started)}
                        )
                print(f"  round {r + 1}: ours {ours[-1]}, PGQueuer {theirs[-1]}", flush=True)
            for key in ("single", "bulk"):
                print(
                    f"enqueue {key}: ours {med(ours, key):,.0f} jobs/s, PGQueuer "
                    f"{med(theirs, key):,.0f}; ratio {med(ours, key) / med(theirs, key):.2f}, "
                    "per round "
                    + ", ".join(
                        f"{o[key] / t[key]:.2f}" for o, t in zip(ours, theirs, strict=True)
                    ),
                    flush=True,
                )
        if "longpoll" in phases:
            workers = register_workers(host, args.long_polls)
            for r in range(args.rounds):
                for preopen in (True, False):
                    reference = long_polls_reference(args, preopen)
                    ours = long_polls_ours(host, workers, args, preopen)
                    how = "pre-opened" if preopen else "connecting at once"
                    print(
                        f"  round {r + 1}, {how}: {args.long_polls:,} parked, wait {args.wait:g} s:"
                        f" p50 {ours['p50']:.2f} s, p99 {ours['p99']:.2f} s, max {ours['max']:.2f}"
                        f" s, over wait + 0.5 s {ours['late']}, statuses {ours['statuses']}; "
                        f"server CPU {ours['cpu_ms']:.1f} ms per claim; "
                        f"reference server p99 {reference['p99']:.2f} s, max "
                        f"{reference['max']:.2f} s  ({web.load()})",
                        flush=True,
                    )
    finally:
        web.stop_all()


if __name__ == "__main__":
    main()
