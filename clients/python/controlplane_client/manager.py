"""``JobManager``: a remote worker's side of the protocol, in two modes.

* **Auto-serve** (an ``execute`` callback, or handlers from ``@operation``):
  ``connect()`` starts a heartbeat thread and a claim loop that runs each job
  in a pool of ``concurrency`` threads and reports it; ``wait()`` blocks until
  SIGINT/SIGTERM and then disconnects gracefully.
* **Manual**: only the heartbeat runs; the caller uses ``claim()`` or the
  ``listen()`` generator and reports with ``complete()``/``fail()``.

Wake-ups: a WebSocket push (if ``websockets`` is installed) makes the claim
loop claim at once; without it the loop long-polls the server (``long_poll``
seconds) or, with ``long_poll=0``, polls every ``polling_interval`` seconds.
No job is missed either way: a push only shortens the wait.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from controlplane_client.api import ApiError, ApiManager, LeaseLostError, WorkerGoneError
from controlplane_client.jobs import ClaimedJob, format_traceback
from controlplane_client.push import PushListener
from controlplane_client.serving import AutoServe

log = logging.getLogger("controlplane_client")

Handler = Callable[[ClaimedJob], Any]


class JobManager:
    """A remote worker. Use it as a context manager so it always says goodbye."""

    def __init__(
        self,
        api: ApiManager,
        *,
        name: str | None = None,
        queues: list[str] | None = None,
        concurrency: int = 1,
        execute: Handler | None = None,
        websocket: bool = True,
        long_poll: float = 20.0,
        polling_interval: float | None = None,
        shutdown_grace: float = 10.0,
    ) -> None:
        self.api = api
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.queues = queues
        self.concurrency = max(1, int(concurrency))
        self.execute = execute
        self.websocket = websocket
        self.long_poll = max(0.0, float(long_poll))
        self.polling_interval = polling_interval
        self.shutdown_grace = shutdown_grace
        self.worker_id: str | None = None
        self.info: dict[str, Any] = {}
        self._declarations: dict[str, dict[str, Any] | str] = {}
        self._handlers: dict[str, Handler] = {}
        self._held: dict[str, ClaimedJob] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()  # threads stop
        self._stop_requested = threading.Event()  # wait() returns
        self._task_ready = threading.Event()
        self._threads: list[threading.Thread] = []
        self._serving: AutoServe | None = None
        self._push: PushListener | None = None

    # --- declarations ---------------------------------------------------------
    def declare(
        self,
        name: str,
        *,
        queue: str | None = None,
        payload_schema: dict[str, Any] | None = None,
        max_attempts: int | None = None,
    ) -> None:
        """Offer operation ``name``. With no definition it must already be known to the server;
        with ``payload_schema`` (JSON Schema) it is declared, and enqueue validates against it."""
        spec = {"queue": queue, "payload_schema": payload_schema, "max_attempts": max_attempts}
        definition = {k: v for k, v in spec.items() if v is not None}
        self._declarations[name] = {"name": name, **definition} if definition else name

    def operation(self, name: str, **definition: Any) -> Callable[[Handler], Handler]:
        """Decorator: declare ``name`` and run it with ``handler(job) -> result`` (auto-serve)."""

        def decorate(handler: Handler) -> Handler:
            self.declare(name, **definition)
            self._handlers[name] = handler
            return handler

        return decorate

    @property
    def auto_serve(self) -> bool:
        return self.execute is not None or bool(self._handlers)

    # --- HTTP -------------------------------------------------------------------
    def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        timeout: float | None = None,
        worker_route: bool = False,
    ) -> Any:
        response = self.api.http.request(
            method,
            self.api.base_url.rstrip("/") + path,
            json=body,
            headers=self.api.get_headers(),
            timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
        )
        if response.status_code == 409:
            raise ApiError.from_response(response)
        if response.status_code == 404 and worker_route:
            error = ApiError.from_response(response)
            raise WorkerGoneError(404, error.message, error.errors)
        self.api.raise_for_status(response)
        if response.is_error:
            raise ApiError.from_response(response)
        return response.json() if response.content else {}

    # --- connection ---------------------------------------------------------------
    def connect(self) -> str:
        """Register (POST /workers) and start the background threads. Returns the worker id."""
        with self._lock:
            if self.worker_id is not None:
                return self.worker_id
            if not self._declarations:
                raise RuntimeError("Declare at least one operation before connecting.")
            self._stop.clear()
            self._stop_requested.clear()
            self._register()
            self._start_thread(self._heartbeat_loop, "controlplane-heartbeat")
            if self.auto_serve:
                self._serving = AutoServe(self)
                self._serving.start()
            if self.websocket:
                self._push = PushListener(
                    self.api.base_url,
                    lambda: (self.worker_id, self.api.get_headers()),
                    self._task_ready.set,
                    self._stop,
                )
                self._push.start()
            assert self.worker_id is not None
            return self.worker_id

    def _register(self) -> None:
        body: dict[str, Any] = {
            "name": self.name,
            "operations": list(self._declarations.values()),
            "concurrency": self.concurrency,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
        }
        if self.queues:
            body["queues"] = self.queues
        self.info = self._request("POST", "/workers", body)
        self.worker_id = str(self.info["id"])
        log.info("registered worker %s (queues %s)", self.worker_id, self.info.get("queues"))

    def _start_thread(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    @property
    def push_connected(self) -> bool:
        return self._push is not None and self._push.connected.is_set()

    def interval(self) -> float:
        """Seconds between polls when a claim came back empty."""
        return float(self.polling_interval or self.info.get("poll_interval") or 2.0)

    # --- heartbeat ------------------------------------------------------------------
    def heartbeat(self) -> dict[str, Any]:
        """PATCH /workers/<id>: stay alive, extend held leases, learn which jobs were lost."""
        with self._lock:
            worker_id = self.worker_id
            held = [{"id": j.id, "lease_token": j.lease_token} for j in self._held.values()]
        try:
            reply = self._request(
                "PATCH", f"/workers/{worker_id}", {"held": held}, worker_route=True
            )
        except WorkerGoneError:
            self._register_again(worker_id)
            return self.info
        cancelled = set(reply.get("cancelled", []))
        timed_out = set(reply.get("timed_out", []))
        for job_id in reply.get("lost", []):
            reason = "cancelled" if job_id in cancelled else "lost"
            self.forget(job_id, "timed_out" if job_id in timed_out else reason)
        return reply

    def _register_again(self, gone_id: str | None) -> None:
        """The server forgot ``gone_id`` (swept after missed heartbeats): drop its jobs,
        register anew."""
        with self._lock:
            if self._stop.is_set() or self.worker_id != gone_id:
                return  # stopping, or another thread already registered again
            log.warning("worker %s was swept; registering again", gone_id)
            self._drop_all("worker swept")
            self._register()

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(float(self.info.get("heartbeat_interval") or 10.0)):
            try:
                self.heartbeat()
            except Exception as error:  # noqa: BLE001 - keep beating; the server sweeps if we can't
                log.warning("heartbeat failed: %s", error)

    def forget(self, job_id: str, reason: str | None) -> None:
        """Stop tracking a job; with a ``reason`` it was lost, and its code is told to stop."""
        with self._lock:
            job = self._held.pop(job_id, None)
        if job is not None and reason:
            job.mark_lost(reason)

    def _drop_all(self, reason: str) -> None:
        with self._lock:
            jobs, self._held = list(self._held.values()), {}
        for job in jobs:
            job.mark_lost(reason)

    # --- claiming ---------------------------------------------------------------------
    def claim(self, limit: int = 1, wait: float = 0.0) -> list[ClaimedJob]:
        """POST /workers/<id>/claim: up to ``limit`` started jobs, waiting ``wait`` s for one."""
        worker_id = self.worker_id
        if worker_id is None:
            if self._stop.is_set():
                return []  # disconnected: connect() explicitly to serve again
            worker_id = self.connect()
        body = {"limit": int(limit), "wait": float(wait)}
        try:
            reply = self._request(
                "POST",
                f"/workers/{worker_id}/claim",
                body,
                timeout=float(wait) + 30.0,
                worker_route=True,
            )
        except WorkerGoneError:
            self._register_again(worker_id)
            return []
        jobs = [ClaimedJob.from_json(data, self) for data in reply.get("jobs", [])]
        with self._lock:
            self._held.update({job.id: job for job in jobs})
        return jobs

    def claim_wait(self) -> float:
        """How long a claim may wait server-side: 0 while pushes arrive, else the long-poll."""
        return 0.0 if self.push_connected or self.long_poll <= 0 else self.long_poll

    def listen(self, polling_interval: float | None = None) -> Iterator[ClaimedJob]:
        """Yield jobs one at a time as they become available, until ``disconnect()``.

        Called from the main thread it also traps SIGINT/SIGTERM, as ``wait()``
        does: a signal lets the job in hand finish (the caller reports it), then
        the generator ends and the worker disconnects gracefully (the server
        requeues anything claimed meanwhile). ``stop()`` does the same from
        another thread.
        """
        self.connect()
        restore = self._trap_signals()
        try:
            while not (self._stop.is_set() or self._stop_requested.is_set()):
                self._task_ready.clear()
                wait = self.claim_wait()
                try:
                    jobs = self.claim(1, wait)
                except (httpx.HTTPError, ApiError) as error:
                    log.warning("claim failed: %s", error)
                    self._stop_requested.wait(polling_interval or self.interval())
                    continue
                for job in jobs:
                    if self._stop_requested.is_set():
                        break  # disconnect() below requeues it
                    yield job
                if not jobs and wait == 0:
                    self._task_ready.wait(polling_interval or self.interval())
        finally:
            restore()
            if self._stop_requested.is_set() and self.worker_id is not None:
                self.disconnect()

    def _trap_signals(self) -> Callable[[], None]:
        """On the main thread, make SIGINT/SIGTERM request a graceful stop; returns the undo."""
        previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():

            def requested(*_: object) -> None:
                self._stop_requested.set()
                self._task_ready.set()  # wake a sleeping poll at once

            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, requested)

        def restore() -> None:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

        return restore

    # --- reports on a held job --------------------------------------------------------------
    def start(self, job: ClaimedJob) -> None:
        """Claiming already started the job (``job.started``); this only records a
        ``job.client_started`` event, as the seed's explicit start step. Optional."""
        self.emit(job, "job.client_started", None, worker=self.worker_id)

    def emit(
        self,
        job: ClaimedJob,
        event: str,
        message: str | None = None,
        *,
        level: str = "info",
        **fields: Any,
    ) -> int:
        """POST /jobs/<id>/events; raises ``LeaseLostError``/``JobCancelledError`` once lost."""
        body = {
            "lease_token": job.lease_token,
            "event": event,
            "message": message or "",
            "level": level,
            "fields": fields,
        }
        try:
            return int(self._request("POST", f"/jobs/{job.id}/events", body)["seq"])
        except LeaseLostError as error:
            self.forget(job.id, "cancelled" if error.job_status == "cancelled" else "lost")
            raise

    def _report(
        self, job: ClaimedJob, action: str, body: dict[str, Any], *, keep: bool = False
    ) -> str | None:
        if job.timed_out:
            # Too late: the server fails it (JobTimeout) at the next heartbeat, which
            # must still name it, so it stays held until then.
            log.warning("job %s: %s not sent: the job ran past its timeout", job.id, action)
            return None
        job.flush_logs()  # the run's log before its outcome
        try:
            reply = self._request(
                "POST", f"/jobs/{job.id}/{action}", {"lease_token": job.lease_token, **body}
            )
        except LeaseLostError as error:
            log.warning("job %s: %s not recorded: %s", job.id, action, error.message)
            self.forget(job.id, "cancelled" if error.job_status == "cancelled" else "lost")
            return None
        if not keep:
            self.forget(job.id, None)
        return str(reply.get("status"))

    def complete(
        self, job: ClaimedJob, result: Any = None, *, deferred: bool = False
    ) -> str | None:
        """Report success, or with ``deferred`` leave the job ``running``, still held.

        A deferred job keeps its ``lease_token`` and stays in this manager's
        held set, so the heartbeat keeps extending its lease; finish it later
        with ``complete(job, result)`` or ``fail(job, error)`` on the same
        ``ClaimedJob`` (any thread). Until then ``disconnect()`` requeues it,
        and a worker that stops heartbeating loses it to the reaper.

        Returns the job's new status (``running`` when deferred), or None when
        this worker no longer held it (cancelled, requeued or reaped; the
        report changed nothing).
        """
        return self._report(
            job, "complete", {"result": result, "deferred": deferred}, keep=deferred
        )

    def held(self) -> list[ClaimedJob]:
        """The jobs this worker holds now: running ones and deferred ones not yet finished."""
        with self._lock:
            return list(self._held.values())

    def fail(
        self,
        job: ClaimedJob,
        error: BaseException | str,
        *,
        error_code: str | None = None,
        retryable: bool | None = None,
        traceback: str | None = None,
    ) -> str | None:
        """Report a failure; ``retryable`` (default: the exception's ``retryable`` attribute)
        requeues it with backoff while attempts remain. Returns the new status or None (lost).

        An exception that was raised sends its formatted traceback too (or pass
        ``traceback``), which the job's page shows.
        """
        code = (
            error_code
            or getattr(error, "error_code", None)
            or (type(error).__name__ if isinstance(error, BaseException) else "RemoteError")
        )
        if retryable is None:
            retryable = bool(getattr(error, "retryable", False))
        body: dict[str, Any] = {
            "error_code": code,
            "error_message": str(error),
            "retryable": retryable,
        }
        if traceback is None and isinstance(error, BaseException):
            traceback = format_traceback(error)
        if traceback:
            body["traceback"] = traceback
        return self._report(job, "fail", body)

    # --- stopping ------------------------------------------------------------------------------
    def wait(self) -> None:
        """Serve until SIGINT/SIGTERM (or ``stop()``), then disconnect gracefully."""
        self.connect()
        restore = self._trap_signals()
        try:
            while not self._stop_requested.wait(0.5):
                pass
        finally:
            restore()
            self.disconnect()

    def stop(self) -> None:
        """Make ``wait()`` return, or ``listen()`` end after the job in hand (thread-safe)."""
        self._stop_requested.set()
        self._task_ready.set()

    def disconnect(self, grace: float | None = None) -> None:
        """Stop claiming, let running jobs finish within ``grace`` seconds, then
        DELETE /workers/<id>: the server requeues what is still held (attempt not counted)."""
        if self.worker_id is None:
            return
        self._stop.set()
        self._task_ready.set()
        if self._serving is not None:
            self._serving.drain(self.shutdown_grace if grace is None else grace)
        for thread in self._threads:
            thread.join(timeout=0.5)
        if self._push is not None:
            self._push.join(timeout=2.0)
        try:
            self._request("DELETE", f"/workers/{self.worker_id}", worker_route=True)
        except WorkerGoneError:
            pass
        except (httpx.HTTPError, ApiError) as error:
            log.warning("disconnect failed (the server will sweep this worker): %s", error)
        self._drop_all("worker disconnected")
        log.info("worker %s disconnected", self.worker_id)
        self.worker_id, self._threads, self._serving, self._push = None, [], None, None
        self._stop_requested.set()

    def __enter__(self) -> JobManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.disconnect()
