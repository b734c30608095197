"""Benchmark: the web tier at production load (issue 12, "Targets").

Starts the product as the README deploys it (``manage.py serve --processes 2``,
uvicorn, one pooled process per core behind one port) on its own PostgreSQL
database (default ``bench_web``) and drives it with ``wrk`` (Debian package):

- ``GET /jobs/<id>/events?after=<last>`` (token; a job with 20 events),
  ``GET /jobs?limit=50`` (token), ``POST /jobs`` (a ping, token) and an
  anonymous ``GET /jobs`` (401), each at 1/8/32/256 clients for ``--seconds``,
  ``--runs`` times: req/s, p50, p99, unexpected statuses (anything but 2xx/3xx,
  or anything but 401 for the anonymous row), 5xx and socket errors (connect,
  read, write, and timeout: no answer within ``--timeout``, 10 s), and the peak
  PostgreSQL connections of the web processes (``pg_stat_activity``,
  ``application_name LIKE 'controlplane-web-%'``, sampled every 50 ms) against
  the bound, processes x (pool + the LISTEN one);
- every row at 32 clients from ``serve`` and from the plain WSGI reference
  (``gunicorn -w 4 --threads 4 controlplane.wsgi``; uvicorn's WSGI interface
  when gunicorn is missing), both running, row by row in turn and the order
  swapped every run, with ours / the reference per row; and the events row
  from a single ``daphne`` process (the old way);
- 1,000 remote workers long-polling ``POST /workers/<id>/claim``
  ``{"limit": 1, "wait": 5}`` at once against one ``serve --processes 1``, for
  an operation that has no jobs: latency (target p99 <= wait + 1 s), statuses,
  and the process's connections before and during;
- the dashboard job list (``GET /dashboard/jobs/``, signed in through the login
  form) at ``--jobs`` jobs, timed 50 times one after the other: p50/p95.

It ends with a table of the issue's targets, PASS or FAIL. The jobs are
filled by ``bench/dashboard_pages.py``'s ``fill`` (``generate_series``; a
week of history, three events per job) and kept for the next run with the
same ``--jobs`` (``--refill`` rebuilds, ``--drop`` drops the database at the
end). Every server it starts is stopped (SIGTERM, then SIGKILL), also on
Ctrl-C.

    .venv/bin/python bench/web.py                                     # 1M jobs, 3 runs
    .venv/bin/python bench/web.py --jobs 20000 --seconds 5 --runs 1   # a quick run
    .venv/bin/python bench/web.py --host-project                      # a user's project

``--host-project`` serves a fresh ``startproject`` edited with the README's
recipe (``bench/host_project.py``, the control plane under ``/ops/``) instead
of ``controlplane/``, with gunicorn and daphne on that project too.

gunicorn is in the ``bench`` extra (``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import dashboard_pages  # noqa: E402  (bench/dashboard_pages.py: the database and its fill)

PASSWORD = "bench-web-password"
USERNAME = "bench-web"
EVENTS = 20  # events of the job the events row polls
BENCH_QUEUES = ("bench-ping", "bench-events", "bench-lp")
LONG_POLL_WORKER = {"name": "lp", "operations": [{"name": "bench.lp", "queue": "bench-lp"}]}
# The bench's own connections, left out of the counts.
MAIN_APP_NAME = "bench-web-main"
SAMPLER_APP_NAME = "bench-web-sampler"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--server",
        default="postgres://postgres@127.0.0.1:5432/postgres",
        help="A database URL on the PostgreSQL server (for CREATE DATABASE).",
    )
    parser.add_argument("--database", default="bench_web", help="The database to fill (created).")
    parser.add_argument("--jobs", type=int, default=1_000_000, help="Jobs for the list pages.")
    parser.add_argument("--chunk", type=int, default=100_000, help="Jobs per INSERT statement.")
    parser.add_argument("--processes", type=int, default=2, help="manage.py serve --processes.")
    parser.add_argument("--threads", type=int, help="manage.py serve --threads (default: its own).")
    parser.add_argument("--clients", default="1,8,32,256", help="wrk connections, comma-separated.")
    parser.add_argument("--seconds", type=int, default=10, help="Duration of one wrk row.")
    parser.add_argument(
        "--timeout",
        type=int,
        default=10,
        help="wrk --timeout (s) of the rows: above the server's own 5 s queue timeout, so a "
        "request it cannot take in time shows as its 503, not as a client giving up.",
    )
    parser.add_argument("--runs", type=int, default=3, help="Repeats of each wrk row (medians).")
    parser.add_argument("--long-polls", type=int, default=1000, help="Concurrent claims.")
    parser.add_argument("--long-poll-seconds", type=int, default=15)
    parser.add_argument("--wait", type=float, default=5.0, help="The claims' wait (s).")
    parser.add_argument("--dashboard-requests", type=int, default=50)
    parser.add_argument(
        "--phases",
        default="main,reference,longpoll",
        help="What to run: main (serve: the rows and the dashboard), reference (gunicorn, "
        "daphne), longpoll, inprocess (CPU per request through Django's WSGI handler, "
        "no server; not run unless named).",
    )
    parser.add_argument(
        "--inprocess-requests",
        type=int,
        default=300,
        help="Requests per round of the inprocess phase (CPU per request, no server).",
    )
    parser.add_argument(
        "--host-project",
        action="store_true",
        help="Serve a fresh startproject with the README's recipe (bench/host_project.py), "
        "mounted at /ops/, instead of controlplane/.",
    )
    parser.add_argument("--refill", action="store_true", help="Rebuild the data even if present.")
    parser.add_argument("--drop", action="store_true", help="Drop the database at the end.")
    return parser.parse_args()


# --- processes -----------------------------------------------------------------------

_started: list[subprocess.Popen] = []  # every process this bench started, stopped at exit


@dataclass(frozen=True)
class Project:
    """The Django project the servers run: this repository's, or a host made from the README."""

    directory: Path = ROOT
    settings: str = "controlplane.settings"
    wsgi: str = "controlplane.wsgi"
    asgi: str = "controlplane.asgi:application"
    prefix: str = ""  # where the control plane is mounted


PROJECT = Project()


def use_host_project(directory: Path) -> None:
    """Serve ``startproject`` + the README's recipe (``bench/host_project.py``) from now on."""
    global PROJECT
    import host_project

    host_project.make_host_project(directory)
    PROJECT = Project(
        directory,
        host_project.SETTINGS_MODULE,
        host_project.WSGI_MODULE,
        host_project.ASGI_APPLICATION,
        host_project.PREFIX,
    )
    print(f"host project (startproject + README recipe) in {directory}", flush=True)


def _interrupted(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """A process in its own session (so its children can be stopped with it), logged to ``log``."""
    with log.open("ab") as out:
        popen = subprocess.Popen(
            argv,
            cwd=PROJECT.directory,
            env={**env, "DJANGO_SETTINGS_MODULE": PROJECT.settings},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _started.append(popen)
    return popen


def stop(popen: subprocess.Popen, grace: float = 15.0) -> None:
    """SIGTERM, then SIGKILL to its whole process group (all of it started here)."""
    if popen.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, signal.SIGKILL)  # stragglers: the group is ours (new session)
    with contextlib.suppress(subprocess.TimeoutExpired):
        popen.wait(5)
    if popen in _started:
        _started.remove(popen)


def stop_all() -> None:
    for popen in list(_started):
        stop(popen, grace=10.0)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def raise_file_limit() -> None:
    """wrk and the server need a descriptor per client; both inherit this limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 65536
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


# --- servers -------------------------------------------------------------------------


@dataclass
class Server:
    name: str
    url: str
    popen: subprocess.Popen
    log: Path
    processes: int


def child_env(database_url: str, static_root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PGAPPNAME"}
    env.update(
        DATABASE_URL=database_url,
        DJANGO_DEBUG="0",
        PYTHONUNBUFFERED="1",
        CONTROLPLANE_STATIC_ROOT=str(static_root),
    )
    return env


def wait_until_answers(server: Server, timeout: float = 120.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.popen.poll() is not None:
            raise RuntimeError(f"{server.name} exited; see {server.log}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(server.url + "/workers", timeout=2, trust_env=False).status_code == 401:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{server.name} did not answer within {timeout:.0f} s; see {server.log}")


def start_server(
    name: str, argv: list[str], env: dict[str, str], logs: Path, port: int, processes: int
) -> Server:
    log = logs / f"{name.split()[0]}-{port}.log"
    url = f"http://127.0.0.1:{port}{PROJECT.prefix}"
    server = Server(name, url, start(argv, env, log), log, processes)
    wait_until_answers(server)
    print(f"\n== {name} on {server.url} (log {log})", flush=True)
    return server


def serve(processes: int, threads: int | None, env: dict[str, str], logs: Path) -> Server:
    port = free_port()
    argv = [sys.executable, "manage.py", "serve", "--port", str(port)]
    argv += ["--processes", str(processes)]
    if threads:
        argv += ["--threads", str(threads)]
    return start_server(" ".join(argv[1:]), argv, env, logs, port, processes)


def wsgi_reference(env: dict[str, str], logs: Path) -> Server:
    port = free_port()
    if importlib.util.find_spec("gunicorn"):  # names in WSGI_NAMES
        argv = [sys.executable, "-m", "gunicorn", "-w", "4", "--threads", "4"]
        argv += ["-b", f"127.0.0.1:{port}", PROJECT.wsgi]
        name, processes = f"gunicorn -w 4 --threads 4 {PROJECT.wsgi}", 4
    else:
        argv = [sys.executable, "-m", "uvicorn", "--interface", "wsgi", "--workers", "2"]
        argv += ["--port", str(port), "--no-access-log", f"{PROJECT.wsgi}:application"]
        name, processes = f"uvicorn --interface wsgi --workers 2 {PROJECT.wsgi}", 2
    return start_server(name, argv, env, logs, port, processes)


WSGI_NAMES = ("gunicorn", "uvicorn")  # the first word of the WSGI reference's name


def daphne(env: dict[str, str], logs: Path) -> Server:
    port = free_port()
    argv = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
    argv += [PROJECT.asgi]
    return start_server(f"daphne {PROJECT.asgi}", argv, env, logs, port, 1)


# --- connections ---------------------------------------------------------------------


@dataclass
class Peak:
    per_process: Counter[str] = field(default_factory=Counter)  # application_name -> peak
    total: int = 0  # the peak of the web processes' sum, at one sample
    others: int = 0  # every other backend on the database (the reference servers)

    def merge(self, other: Peak) -> Peak:
        merged = Peak(Counter(self.per_process), max(self.total, other.total))
        for name, n in other.per_process.items():
            merged.per_process[name] = max(merged.per_process[name], n)
        merged.others = max(self.others, other.others)
        return merged

    def describe(self) -> str:
        parts = "+".join(str(n) for _, n in sorted(self.per_process.items()))
        web = f"{self.total} ({parts})" if parts else "0"
        return web + (f", other {self.others}" if self.others else "")


COUNT_SQL = """
SELECT CASE WHEN application_name LIKE 'controlplane-web-%%' THEN application_name END, count(*)
FROM pg_stat_activity
WHERE datname = %s AND application_name NOT IN (%s, %s) AND backend_type = 'client backend'
GROUP BY 1
"""


class Sampler:
    """Samples the database's connections every 50 ms in a thread; ``peak`` when done."""

    def __init__(self, dsn: str, database: str, interval: float = 0.05) -> None:
        self.dsn, self.database, self.interval = dsn, database, interval
        self.peak = Peak()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self, conn) -> Peak:
        rows = conn.execute(COUNT_SQL, [self.database, MAIN_APP_NAME, SAMPLER_APP_NAME]).fetchall()
        now = Peak()
        for name, n in rows:
            if name is None:
                now.others = n
            else:
                now.per_process[name] = n
        now.total = sum(now.per_process.values())
        return now

    def _run(self) -> None:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True, application_name=SAMPLER_APP_NAME) as c:
            while True:
                self.peak = self.peak.merge(self.sample(c))
                if self._stop.wait(self.interval):
                    break

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


# --- wrk -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    path: str
    method: str = "GET"
    body: str | None = None
    token: bool = True
    expected: int | None = None  # one status expected; None: any 2xx/3xx


@dataclass
class Result:
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    unexpected: int
    s5xx: int
    errors: dict[str, int]
    peak: Peak
    statuses: Counter[int]
    first_5xx: list[str]  # the first 5xx answer of each wrk thread, status and body

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def socket_errors(self) -> int:
        return sum(self.errors[k] for k in ("connect", "read", "write", "timeout"))


LUA = """-- written by bench/web.py
wrk.method = "{method}"
{body}
wrk.headers["Content-Type"] = "application/json"
{auth}
local threads = {{}}
function setup(thread) table.insert(threads, thread) end
function init(args) s5xx = 0; unexpected = 0; statuses = {{}}; first5xx = "" end
function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
  if status >= 500 then
    s5xx = s5xx + 1
    if first5xx == "" then first5xx = status .. " " .. string.sub(body, 1, 200) end
  end
  if {unexpected} then unexpected = unexpected + 1 end
end
function done(summary, latency, requests)
  local s5, un, all = 0, 0, {{}}
  for _, t in ipairs(threads) do
    s5 = s5 + t:get("s5xx"); un = un + t:get("unexpected")
    for status, n in pairs(t:get("statuses")) do all[status] = (all[status] or 0) + n end
  end
  for status, n in pairs(all) do io.write(string.format("BENCHSTATUS %d %d\\n", status, n)) end
  for _, t in ipairs(threads) do
    local first = t:get("first5xx")
    if first ~= "" then io.write("BENCH5XX " .. string.gsub(first, "\\n", " ") .. "\\n") end
  end
  local e = summary.errors
  io.write(string.format(
    "BENCH requests=%d duration=%d p50=%.0f p99=%.0f max=%.0f s5xx=%d unexpected=%d " ..
    "connect=%d read=%d write=%d timeout=%d status=%d\\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    latency.max, s5, un, e.connect, e.read, e.write, e.timeout, e.status))
end
"""


def lua_script(row: Row, token: str, directory: Path) -> Path:
    unexpected = f"status ~= {row.expected}" if row.expected else "status < 200 or status >= 400"
    text = LUA.format(
        method=row.method,
        body=f"wrk.body = '{row.body}'" if row.body else "",
        auth=f'wrk.headers["Authorization"] = "Token {token}"' if row.token else "",
        unexpected=unexpected,
    )
    path = directory / f"{row.key}.lua"
    path.write_text(text)
    return path


def parse_wrk(output: str, peak: Peak) -> Result:
    match = re.search(r"^BENCH (.*)$", output, re.MULTILINE)
    if not match:
        raise RuntimeError(f"wrk printed no summary:\n{output}")
    v = {k: int(n) for k, n in (pair.split("=") for pair in match.group(1).split())}
    errors = {k: v[k] for k in ("connect", "read", "write", "timeout", "status")}
    statuses = Counter(
        {int(code): int(n) for code, n in re.findall(r"^BENCHSTATUS (\d+) (\d+)$", output, re.M)}
    )
    first_5xx = re.findall(r"^BENCH5XX (.*)$", output, re.M)
    return Result(
        v["requests"],
        v["duration"] / 1e6,
        v["p50"] / 1000,
        v["p99"] / 1000,
        v["max"] / 1000,
        v["unexpected"],
        v["s5xx"],
        errors,
        peak,
        statuses,
        first_5xx,
    )


def wrk(
    url: str, script: Path, clients: int, seconds: int, timeout: int, sampler: Sampler, log: Path
) -> Result:
    argv = ["wrk", "-t", str(min(2, clients)), "-c", str(clients), "-d", f"{seconds}s"]
    argv += ["--timeout", f"{timeout}s", "--latency", "-s", str(script), url]
    with sampler:
        popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        _started.append(popen)
        output, _ = popen.communicate()
        _started.remove(popen)
    with log.open("a") as out:
        out.write(f"$ {' '.join(argv)}\n{output}\n")
    return parse_wrk(output, sampler.peak)


def settle(server: Server, *, quick_ms: float = 50.0, limit_seconds: float = 15.0) -> None:
    """Wait until ``server`` has worked off what wrk left queued when it stopped.

    wrk closes its connections at the end of a row, but a server still runs
    the requests it had read: after 256 clients of the job list, seconds of
    them. The next row would measure that backlog (a 1-client row showing a
    one-second p99), so each row starts once a cheap request answers quickly.
    """
    import httpx

    deadline = time.monotonic() + limit_seconds
    while time.monotonic() < deadline:
        started = time.monotonic()
        with contextlib.suppress(httpx.TransportError):
            httpx.get(server.url + "/workers", timeout=limit_seconds, trust_env=False)
            if (time.monotonic() - started) * 1000 < quick_ms:
                return
        time.sleep(0.05)


# --- the data ------------------------------------------------------------------------


def remove_bench_rows() -> None:
    """What earlier runs of this bench added (pings, the events job, the long-poll worker)."""
    from django.db import connection

    with connection.cursor() as cursor:
        queues = [list(BENCH_QUEUES)]
        select = "SELECT id FROM controlplane_job WHERE queue = ANY(%s)"
        cursor.execute(f"DELETE FROM controlplane_jobevent WHERE job_id IN ({select})", queues)
        cursor.execute("DELETE FROM controlplane_job WHERE queue = ANY(%s)", queues)
        cursor.execute("DELETE FROM controlplane_worker WHERE name = 'lp' AND kind = 'remote'")


def bench_user() -> str:
    """A superuser with a password (the dashboard's login) and a DRF token; the token."""
    from django.contrib.auth.models import User
    from rest_framework.authtoken.models import Token

    user = User.objects.filter(username=USERNAME).first() or User.objects.create_superuser(
        USERNAME, "bench@example.com", PASSWORD
    )
    user.set_password(PASSWORD)
    user.save()
    return Token.objects.get_or_create(user=user)[0].key


def events_job() -> tuple[str, int]:
    """A job with ``EVENTS`` events; its id and its last seq."""
    from django.db import connection

    from jobs.enqueue import enqueue

    job = enqueue("ping", queue="bench-events")
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO controlplane_jobevent (job_id, seq, ts, event, level, message, fields) "
            "SELECT %s, s, now(), 'bench.tick', 'info', 'tick ' || s, jsonb_build_object('n', s) "
            "FROM generate_series(2, %s) AS s",
            [job.pk, EVENTS],
        )
        cursor.execute(
            "UPDATE controlplane_job SET last_event_seq = %s, last_event_at = now() WHERE id = %s",
            [EVENTS, job.pk],
        )
    return str(job.pk), EVENTS


def prepare(args: argparse.Namespace) -> tuple[str, str, int]:
    """Migrate, fill (or reuse) the jobs; the token, the events job and its last seq."""
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    remove_bench_rows()
    started = time.perf_counter()
    dashboard_pages.fill(argparse.Namespace(jobs=args.jobs, chunk=args.chunk, refill=args.refill))
    print(f"data ready in {time.perf_counter() - started:.0f} s", flush=True)
    token = bench_user()
    job_id, last = events_job()
    return token, job_id, last


# --- the measurements ----------------------------------------------------------------


def rows(job_id: str, last: int) -> list[Row]:
    return [
        Row("events", "GET /jobs/<id>/events?after=<last>", f"/jobs/{job_id}/events?after={last}"),
        Row("list", "GET /jobs?limit=50", "/jobs?limit=50"),
        Row(
            "enqueue",
            "POST /jobs (ping)",
            "/jobs",
            "POST",
            '{"operation": "ping", "queue": "bench-ping"}',
        ),
        Row("anonymous", "anonymous GET /jobs (401)", "/jobs", token=False, expected=401),
    ]


@dataclass
class Context:
    args: argparse.Namespace
    dsn: str
    scripts: dict[str, Path]
    logs: Path
    results: dict[tuple[str, str, int], list[Result]] = field(default_factory=dict)


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.1f} / {five:.1f} / {fifteen:.1f}"


def run_row(
    ctx: Context, server: Server, row: Row, clients: int, run: int, seconds: int | None = None
) -> Result:
    sampler = Sampler(ctx.dsn, ctx.args.database)
    result = wrk(
        server.url + row.path,
        ctx.scripts[row.key],
        clients,
        seconds or ctx.args.seconds,
        ctx.args.timeout,
        sampler,
        ctx.logs / "wrk.log",
    )
    settle(server)
    print(
        f"  {server.name.split()[0]:<9} {row.label:<38} c={clients:<4} run {run}: "
        f"{result.rps:8,.0f} req/s  p50 {result.p50_ms:7.1f} ms  p99 {result.p99_ms:7.1f} ms  "
        f"unexpected {result.unexpected}  5xx {result.s5xx}  socket errors {result.socket_errors}"
        f"  peak conns {result.peak.describe()}  ({load()})"
        + (f"  statuses {statuses(result)}" if result.unexpected or result.s5xx else "")
        + "".join(f"\n      first 5xx: {answer}" for answer in result.first_5xx),
        flush=True,
    )
    return result


def statuses(result: Result) -> str:
    return ", ".join(f"{code}: {n:,}" for code, n in sorted(result.statuses.items()))


def warm_up(ctx: Context, server: Server, row_list: list[Row]) -> None:
    """Every row for 2 s at 8 clients, unrecorded."""
    for row in row_list:
        wrk(
            server.url + row.path,
            ctx.scripts[row.key],
            8,
            2,
            ctx.args.timeout,
            Sampler(ctx.dsn, ctx.args.database),
            ctx.logs / "wrk.log",
        )


def measure_rows(ctx: Context, server: Server, row_list: list[Row], clients: list[int]) -> None:
    """Warm up every row, then ``--runs`` rounds over rows x clients (rounds interleaved)."""
    warm_up(ctx, server, row_list)
    for run in range(1, ctx.args.runs + 1):
        for row in row_list:
            for c in clients:
                result = run_row(ctx, server, row, c, run)
                ctx.results.setdefault((server.name, row.key, c), []).append(result)


@dataclass
class Summary:
    rps: float
    p50_ms: float
    p99_ms: float
    unexpected: int
    s5xx: int
    socket_errors: int
    peak: Peak


def summarise(results: list[Result]) -> Summary:
    peak = Peak()
    for r in results:
        peak = peak.merge(r.peak)
    return Summary(
        statistics.median(r.rps for r in results),
        statistics.median(r.p50_ms for r in results),
        statistics.median(r.p99_ms for r in results),
        sum(r.unexpected for r in results),
        sum(r.s5xx for r in results),
        sum(r.socket_errors for r in results),
        peak,
    )


@dataclass
class LongPoll:
    result: Result
    cold: int
    before: int
    during: int
    bound: int


def web_connections(ctx: Context, seconds: float = 1.0) -> int:
    with Sampler(ctx.dsn, ctx.args.database) as sampler:
        time.sleep(seconds)
    return sampler.peak.total


def long_polls(ctx: Context, server: Server, token: str, events: Row, pool: int) -> LongPoll:
    import httpx

    cold = web_connections(ctx)
    auth = {"Authorization": f"Token {token}"}
    with httpx.Client(base_url=server.url, headers=auth, trust_env=False, timeout=30) as api:
        created = api.post("/workers", json=LONG_POLL_WORKER)
        created.raise_for_status()
        worker = created.json()["id"]
        # Warm-up: one parked claim (starts the relay's LISTEN connection) and a burst of
        # events polls (the pool at its working size), so "before" is the process at work.
        api.post(f"/workers/{worker}/claim", json={"limit": 1, "wait": 1}).raise_for_status()
    wrk(
        server.url + events.path,
        ctx.scripts[events.key],
        32,
        3,
        ctx.args.timeout,
        Sampler(ctx.dsn, ctx.args.database),
        ctx.logs / "wrk.log",
    )
    before = web_connections(ctx)
    claim = Row(
        "claim",
        f"POST /workers/<id>/claim wait={ctx.args.wait:g}",
        f"/workers/{worker}/claim",
        "POST",
        f'{{"limit": 1, "wait": {ctx.args.wait:g}}}',
    )
    ctx.scripts[claim.key] = lua_script(claim, token, ctx.logs)
    sampler = Sampler(ctx.dsn, ctx.args.database)
    timeout = int(ctx.args.wait) + 35
    result = wrk(
        server.url + claim.path,
        ctx.scripts[claim.key],
        ctx.args.long_polls,
        ctx.args.long_poll_seconds,
        timeout,
        sampler,
        ctx.logs / "wrk.log",
    )
    poll = LongPoll(result, cold, before, result.peak.total, pool + 1)
    print(
        f"  {ctx.args.long_polls:,} long-polls ({ctx.args.long_poll_seconds} s, "
        f"wait {ctx.args.wait:g} s): {result.requests:,} answered, p50 {result.p50_ms:,.0f} ms, "
        f"p99 {result.p99_ms:,.0f} ms, max {result.max_ms:,.0f} ms, non-2xx {result.unexpected}, "
        f"5xx {result.s5xx}, socket errors {result.socket_errors} {result.errors}, "
        f"statuses {statuses(result)}; "
        f"web connections cold {cold}, before {before}, during {poll.during} "
        f"(bound {pool + 1})  ({load()})"
        + "".join(f"\n      first 5xx: {answer}" for answer in result.first_5xx),
        flush=True,
    )
    return poll


def percentile(values: list[float], q: float) -> float:
    return dashboard_pages.percentile(values, q)


def dashboard_list(url: str, requests: int) -> tuple[float, float]:
    """Sign in through the login form; time ``GET /dashboard/jobs/``; p50 and p95 in ms."""
    import httpx

    with httpx.Client(base_url=url, trust_env=False, timeout=60) as client:
        client.get("/accounts/login/").raise_for_status()
        signed_in = client.post(
            "/accounts/login/",
            data={
                "username": USERNAME,
                "password": PASSWORD,
                "csrfmiddlewaretoken": client.cookies["csrftoken"],
            },
        )
        if signed_in.status_code != 302:
            raise RuntimeError(f"login answered {signed_in.status_code}")
        for _ in range(5):
            client.get("/dashboard/jobs/")
        times = []
        for _ in range(requests):
            started = time.perf_counter()
            response = client.get("/dashboard/jobs/")
            times.append((time.perf_counter() - started) * 1000)
            if response.status_code != 200:
                raise RuntimeError(f"GET /dashboard/jobs/ answered {response.status_code}")
    return percentile(times, 0.5), percentile(times, 0.95)


# --- the report ----------------------------------------------------------------------


def print_table(ctx: Context, row_list: list[Row], bound: int, per_process: int) -> None:
    print(
        f"\nMedians of {ctx.args.runs} run(s) of {ctx.args.seconds} s; unexpected, 5xx and "
        "socket errors summed over the runs; peak connections: the most over the runs, "
        f"total (per process); bound {bound} = {ctx.args.processes} x ({per_process - 1} + 1)"
    )
    print(
        "\n| server | request | clients | req/s | p50 ms | p99 ms | unexpected | 5xx "
        "| socket errors | peak web conns |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    labels = {row.key: row.label for row in row_list}
    for (server, key, clients), results in ctx.results.items():
        s = summarise(results)
        print(
            f"| {server.split()[0]} | {labels[key]} | {clients} | {s.rps:,.0f} | "
            f"{s.p50_ms:.1f} | {s.p99_ms:.1f} | {s.unexpected} | {s.s5xx} | "
            f"{s.socket_errors} | {s.peak.describe()} |"
        )


def target_rows(
    ctx: Context,
    main: str,
    bound: int,
    per_process: int,
    poll: LongPoll | None,
    dashboard: tuple[float, float] | None,
) -> list[tuple[str, str, bool]]:
    def at(key: str, clients: int) -> Summary | None:
        results = ctx.results.get((main, key, clients))
        return summarise(results) if results else None

    out: list[tuple[str, str, bool]] = []
    if e := at("events", 32):
        out.append(
            (
                "`GET /jobs/<id>/events` at 32 clients: ≥ 1,000 req/s, p99 ≤ 100 ms",
                f"{e.rps:,.0f} req/s, p99 {e.p99_ms:.1f} ms",
                e.rps >= 1000 and e.p99_ms <= 100,
            )
        )
    if j := at("list", 32):
        out.append(
            (
                "`GET /jobs?limit=50` at 32 clients: ≥ 1,000 req/s",
                f"{j.rps:,.0f} req/s",
                j.rps >= 1000,
            )
        )
    if p := at("enqueue", 32):
        out.append(("`POST /jobs` at 32 clients: ≥ 500 req/s", f"{p.rps:,.0f} req/s", p.rps >= 500))
    if a := at("anonymous", 32):
        out.append(
            ("anonymous 401 at 32 clients: ≥ 2,000 req/s", f"{a.rps:,.0f} req/s", a.rps >= 2000)
        )
    big = [summarise(r) for (s, _, c), r in ctx.results.items() if s == main and c == 256]
    if big:
        s5, se = sum(s.s5xx for s in big), sum(s.socket_errors for s in big)
        out.append(
            (
                "256 clients (4 rows × runs): 0 5xx, 0 socket errors",
                f"{s5} 5xx, {se} socket errors",
                s5 == 0 and se == 0,
            )
        )
    every = Peak()
    for (s, _, _), results in ctx.results.items():
        if s == main:
            for r in results:
                every = every.merge(r.peak)
    most = max(every.per_process.values(), default=0)
    if main:
        out.append(
            (
                f"peak web connections (every row): ≤ {bound}, ≤ {per_process} per process",
                f"{every.total} in all, at most {most} in one process",
                every.total <= bound and most <= per_process,
            )
        )
    if poll:
        r = poll.result
        ok = r.p99_ms <= (ctx.args.wait + 1) * 1000 and r.unexpected == 0 and r.socket_errors == 0
        out.append(
            (
                f"{ctx.args.long_polls:,} long-polls: p99 ≤ wait + 1 s = "
                f"{(ctx.args.wait + 1) * 1000:,.0f} ms, all 200",
                f"p99 {r.p99_ms:,.0f} ms (max {r.max_ms:,.0f}), {r.requests:,} answered, "
                f"non-200 {r.unexpected}, socket errors {r.socket_errors}",
                ok,
            )
        )
        out.append(
            (
                f"{ctx.args.long_polls:,} long-polls: no extra connections",
                f"before {poll.before}, during {poll.during} (bound {poll.bound})",
                poll.during <= poll.before and poll.during <= poll.bound,
            )
        )
    if dashboard:
        out.append(
            (
                f"dashboard job list at {ctx.args.jobs:,} jobs: p95 ≤ 100 ms",
                f"p50 {dashboard[0]:.1f} ms, p95 {dashboard[1]:.1f} ms",
                dashboard[1] <= 100,
            )
        )
    return out


def print_targets(targets: list[tuple[str, str, bool]]) -> None:
    print("\n| target | measured | |")
    print("|---|---|---|")
    for name, measured, ok in targets:
        print(f"| {name} | {measured} | {'PASS' if ok else 'FAIL'} |")


# --- CPU per request, in this process --------------------------------------------------


def in_process(row_list: list[Row], token: str, requests: int) -> None:
    """CPU (this thread) and wall time per request of each row through Django's WSGI handler.

    No server, no socket, no wrk: the view, its middleware and its database
    round trips, as one web thread runs them (without the web pool: this
    process's own connection). 30 warm-ups, then 5 rounds of ``requests``;
    the median round. On a shared machine this is the figure that compares
    two versions of the code: the req/s of a row move with the neighbours.
    """
    import io

    from django.core.handlers.wsgi import WSGIHandler

    app = WSGIHandler()
    print(f"\n== in process (Django's WSGI handler, {requests} requests x 5 rounds)", flush=True)
    for row in row_list:
        path, _, query = row.path.partition("?")
        body = (row.body or "").encode()
        environ = {
            "REQUEST_METHOD": row.method,
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "8000",
            "HTTP_HOST": "127.0.0.1:8000",
            "CONTENT_TYPE": "application/json",
            "CONTENT_LENGTH": str(len(body)),
            "wsgi.url_scheme": "http",
            "wsgi.errors": sys.stderr,
        }
        if row.token:
            environ["HTTP_AUTHORIZATION"] = f"Token {token}"
        statuses: list[str] = []

        def one(
            statuses: list[str] = statuses, environ: dict = environ, body: bytes = body
        ) -> None:
            response = app(
                {**environ, "wsgi.input": io.BytesIO(body)},
                lambda status, headers, exc_info=None: statuses.append(status),
            )
            b"".join(response)
            response.close()

        for _ in range(30):
            one()
        rounds = []
        for _ in range(5):
            cpu, wall = time.thread_time(), time.perf_counter()
            for _ in range(requests):
                one()
            rounds.append(
                ((time.thread_time() - cpu) / requests, (time.perf_counter() - wall) / requests)
            )
        cpu_ms = statistics.median(r[0] for r in rounds) * 1000
        wall_ms = statistics.median(r[1] for r in rounds) * 1000
        print(
            f"  {row.label:<38} CPU {cpu_ms:6.3f} ms  wall {wall_ms:6.3f} ms per request "
            f"(rounds {' '.join(f'{r[0] * 1000:.2f}' for r in rounds)})  status {statuses[-1]}"
            f"  ({load()})",
            flush=True,
        )


# --- main ----------------------------------------------------------------------------


def pool_size(threads: int | None) -> int:
    """The pool of one web process, as ``controlplane.settings`` computes it."""
    if os.environ.get("CONTROLPLANE_WEB_DB_POOL_SIZE"):
        return int(os.environ["CONTROLPLANE_WEB_DB_POOL_SIZE"])
    return (threads or int(os.environ.get("CONTROLPLANE_WEB_THREADS") or 1)) + 2


def setup_django(args: argparse.Namespace) -> str:
    """The bench's own Django (no pool; its connection is left out of the counts)."""
    url = dashboard_pages.with_database(args.server, args.database)
    os.environ["DATABASE_URL"] = url
    os.environ["PGAPPNAME"] = MAIN_APP_NAME
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    os.environ.pop("CONTROLPLANE_DB_POOL", None)
    dashboard_pages.ensure_database(args)
    import django

    django.setup()
    return url


def measure_main(
    ctx: Context, env: dict[str, str], row_list: list[Row], clients: list[int]
) -> tuple[str, tuple[float, float]]:
    server = serve(ctx.args.processes, ctx.args.threads, env, ctx.logs)
    try:
        measure_rows(ctx, server, row_list, clients)
        p50, p95 = dashboard_list(server.url, ctx.args.dashboard_requests)
        print(
            f"  dashboard GET /dashboard/jobs/ ({ctx.args.jobs:,} jobs, "
            f"{ctx.args.dashboard_requests} requests): p50 {p50:.1f} ms  p95 {p95:.1f} ms  "
            f"({load()})",
            flush=True,
        )
        return server.name, (p50, p95)
    finally:
        stop(server.popen)


COMPARED = "serve-vs-wsgi"  # the name of the serve that runs beside the WSGI reference


def measure_references(ctx: Context, env: dict[str, str], row_list: list[Row]) -> None:
    """Every row at 32 clients from ``serve`` and the WSGI reference, interleaved; then daphne.

    Both servers run at once (the idle one costs nothing); each run measures a
    row on one and then on the other, the order swapped every run, so the two
    see the same minutes of a shared machine and the ratio means something.
    """
    ours = serve(ctx.args.processes, ctx.args.threads, env, ctx.logs)
    ours.name = f"{COMPARED} {ours.name}"
    reference = wsgi_reference(env, ctx.logs)
    try:
        for server in (ours, reference):
            warm_up(ctx, server, row_list)
        for run in range(1, ctx.args.runs + 1):
            for row in row_list:
                pair = (ours, reference) if run % 2 else (reference, ours)
                for server in pair:
                    result = run_row(ctx, server, row, 32, run)
                    ctx.results.setdefault((server.name, row.key, 32), []).append(result)
    finally:
        stop(ours.popen)
        stop(reference.popen)
    server = daphne(env, ctx.logs)
    try:
        measure_rows(ctx, server, [row_list[0]], [32])
    finally:
        stop(server.popen)


def ratio_rows(ctx: Context, row_list: list[Row]) -> list[tuple[str, str, bool]]:
    """Ours / the WSGI reference per row (the interleaved runs of ``measure_references``)."""
    ours = next((s for (s, _, _) in ctx.results if s.startswith(COMPARED)), None)
    reference = next((s for (s, _, _) in ctx.results if s.split()[0] in WSGI_NAMES), None)
    out: list[tuple[str, str, bool]] = []
    if ours is None or reference is None:
        return out
    for row in row_list:
        mine, theirs = (
            ctx.results.get((ours, row.key, 32)),
            ctx.results.get((reference, row.key, 32)),
        )
        if not mine or not theirs:
            continue
        a, b = summarise(mine), summarise(theirs)
        per_run = " / ".join(
            f"{m.rps:,.0f}:{t.rps:,.0f}" for m, t in zip(mine, theirs, strict=False)
        )
        ratio = a.rps / b.rps if b.rps else 0.0
        out.append(
            (
                f"{row.label} at 32 clients: ≥ 1.0× {reference.split()[0]} (same run, interleaved)",
                f"{a.rps:,.0f} / {b.rps:,.0f} req/s = {ratio:.2f}× (runs {per_run})",
                ratio >= 1.0,
            )
        )
    return out


def measure_long_polls(
    ctx: Context, env: dict[str, str], token: str, events: Row, pool: int
) -> LongPoll:
    server = serve(1, ctx.args.threads, env, ctx.logs)
    try:
        return long_polls(ctx, server, token, events, pool)
    finally:
        stop(server.popen)


def run(args: argparse.Namespace) -> None:
    url = setup_django(args)
    print(
        f"bench/web.py {' '.join(sys.argv[1:])}  ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
        f"{os.cpu_count()} cores, {load()})",
        flush=True,
    )
    token, job_id, last = prepare(args)
    logs = Path(tempfile.mkdtemp(prefix="bench-web-"))
    print(f"logs and wrk scripts in {logs}", flush=True)
    if args.host_project:
        use_host_project(logs / "host")
    env = child_env(url, logs / "static")
    row_list = rows(job_id, last)
    ctx = Context(args, url, {r.key: lua_script(r, token, logs) for r in row_list}, logs)
    clients = [int(c) for c in args.clients.split(",")]
    pool = pool_size(args.threads)
    bound = args.processes * (pool + 1)

    from django.db import connections

    phases = set(args.phases.split(","))
    if "inprocess" in phases:
        in_process(row_list, token, args.inprocess_requests)
    connections.close_all()  # idle during the load: nothing of ours on the server
    main, dashboard = "", None
    if "main" in phases:
        main, dashboard = measure_main(ctx, env, row_list, clients)
    if "reference" in phases:
        measure_references(ctx, env, row_list)
    poll = None
    if "longpoll" in phases:
        poll = measure_long_polls(ctx, env, token, row_list[0], pool)
    print_table(ctx, row_list, bound, pool + 1)
    print_targets(
        target_rows(ctx, main, bound, pool + 1, poll, dashboard) + ratio_rows(ctx, row_list)
    )
    print(f"\n{load()}", flush=True)
    if args.drop:
        dashboard_pages.drop_database(args)
        print(f"dropped database {args.database}")


def main() -> None:
    args = parse_args()
    raise_file_limit()
    signal.signal(signal.SIGTERM, _interrupted)
    try:
        run(args)
    except KeyboardInterrupt:
        print("\ninterrupted; stopping the servers", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        stop_all()


if __name__ == "__main__":
    main()
