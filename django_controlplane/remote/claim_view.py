"""``POST /workers/<id>/claim`` ``{limit?, wait?}``: a long-poll that parks on the event loop.

A thousand remote workers may wait for work at once on one web process. Each
claim attempt is short and runs on the web threads (``django_controlplane.web.threads``);
between attempts the request waits for the process's relay
(``django_controlplane.remote.relay``) on the event loop, holding no thread and no
database connection. The relay wakes parked claims one at a time, so one
new job costs one or two attempts, not one per waiting worker. A claim that
found a rate-limited queue's bucket empty also tries again, unwoken, when
the next token is due (``ClaimAttempt.retry_in``); until then its attempts
skip that queue without a query, so wake-ups cannot turn into a claim storm.

A claim that finds nothing answers its empty list a little before its wait is
up: a random part of a tenth of the wait, at most ``EARLY_ANSWER_MAX_SECONDS``.
Workers that parked together (a fleet started at once, or all woken by one
job) would otherwise all answer in the same instant, a burst that makes the
last of them late by the time it takes to answer the others; spread out, the
answers never exceed the wait, and the workers simply ask again.

The attempt itself is a DRF view (``ClaimAttemptView``): authentication,
the permission, the body and the error shape are those of every other
route, checked again on every attempt (a revoked token stops a long-poll).
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.utils.decorators import classonlymethod
from django.views import View
from django.views.decorators.csrf import csrf_exempt
from rest_framework.request import Request
from rest_framework.response import Response

from django_controlplane import remote
from django_controlplane.api.base import WORKER_ID, error_responses
from django_controlplane.api.defaults import extend_schema
from django_controlplane.api.serializers import ClaimResultSerializer
from django_controlplane.remote.relay import relay
from django_controlplane.remote.runs import ClaimAttempt
from django_controlplane.remote.views import (
    ClaimBody,
    RemoteView,
    _body,
    claimed_json,
    remote_endpoint,
)
from django_controlplane.web.dispatch import RECEIVED_AT
from django_controlplane.web.overload import BUSY_MESSAGE, unavailable_response
from django_controlplane.web.threads import Busy, run_blocking


@dataclass(frozen=True)
class Parked:
    """A long-poll between attempts: what the next attempt needs."""

    limit: int
    wait: float
    attempt: ClaimAttempt


class ClaimAttemptView(RemoteView):
    """One attempt, as a DRF view; the long-poll around it is ``claim_view``."""

    @extend_schema(
        operation_id="workers_claim",
        summary="Remote worker: claim jobs",
        description=(
            "Claims and starts up to 'limit' jobs of the worker's queues and operations. "
            f"With 'wait' (seconds, at most {remote.MAX_WAIT_SECONDS:g}) and nothing to claim, "
            "the request waits for a job and answers an empty list when the wait is up "
            "(up to a tenth of it, at most 0.5 s, earlier: parked claims answer spread out)."
        ),
        tags=["remote workers"],
        parameters=[WORKER_ID],
        request=ClaimBody,
        responses={200: ClaimResultSerializer, **error_responses(400, 401, 403, 404, 413, 503)},
    )
    def post(self, request: Request, worker_id: str) -> Response:
        return self._attempt(request, worker_id)

    @staticmethod
    @remote_endpoint
    def _attempt(request: Request, worker_id: str) -> Response:
        parked: Parked | None = getattr(request._request, "parked_claim", None)
        if parked is None:
            body = _body(request, ClaimBody) if request.data else {}
            limit = body.get("limit", 1)
            wait = min(float(body.get("wait") or 0), remote.MAX_WAIT_SECONDS)
        else:
            limit, wait = parked.limit, parked.wait
        attempt = remote.claim(worker_id=worker_id, user=request.user, limit=limit)
        response = Response({"jobs": [claimed_json(job) for job in attempt.jobs]})
        if not attempt.jobs and wait > 0:
            response.parked = Parked(limit=limit, wait=wait, attempt=attempt)
        response.claimed = len(attempt.jobs)
        return response


_attempt_view = ClaimAttemptView.as_view()


def _attempt_once(request: HttpRequest, worker_id: str) -> HttpResponse:
    response = _attempt_view(request, worker_id=worker_id)
    return response.render() if hasattr(response, "render") else response


async def _try(request: HttpRequest, worker_id: str) -> HttpResponse:
    try:
        return await run_blocking(_attempt_once, request, worker_id)
    except Busy:
        return unavailable_response(BUSY_MESSAGE)


# The most a parked claim answers before its wait is up (module docstring).
EARLY_ANSWER_MAX_SECONDS = 0.5


def early_answer(wait: float) -> float:
    """How much before ``wait`` is up this parked claim answers: spread, at most a tenth."""
    return random.uniform(0.0, min(EARLY_ANSWER_MAX_SECONDS, wait / 10))


class ClaimView(View):
    http_method_names = ["post"]

    async def post(self, request: HttpRequest, worker_id: str) -> HttpResponse:
        response = await _try(request, worker_id)
        parked: Parked | None = getattr(response, "parked", None)
        if parked is None:
            return response
        request.parked_claim = parked
        loop = asyncio.get_running_loop()
        scope = getattr(request, "scope", {})
        deadline = scope.get(RECEIVED_AT, loop.time()) + parked.wait - early_answer(parked.wait)
        attempt = parked.attempt
        while (remaining := deadline - loop.time()) > 0:
            token_due = attempt.retry_in
            timeout = remaining if token_due is None else min(remaining, token_due)
            wake = await relay.wait(attempt.queues, attempt.kind, timeout)
            if wake is None and (token_due is None or token_due >= remaining):
                break
            claimed: bool | None = None
            try:
                again = await _try(request, worker_id)
                claimed = bool(getattr(again, "claimed", 0)) if again.status_code == 200 else None
            finally:
                if wake is not None:
                    relay.finished(wake, attempt.kind, claimed=claimed)
            next_parked: Parked | None = getattr(again, "parked", None)
            if next_parked is None:
                return again  # jobs, or an error (the worker was removed, the token revoked)
            attempt = next_parked.attempt
        return response  # the empty list of the first attempt

    @classonlymethod
    def as_view(cls, **initkwargs: Any) -> Any:
        view = csrf_exempt(super().as_view(**initkwargs))
        # For drf-spectacular: /schema describes this route from the DRF view of one attempt.
        view.cls = ClaimAttemptView
        view.initkwargs = {}
        return view
