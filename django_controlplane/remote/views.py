"""REST handlers for remote workers (docs/remote-workers.md).

Thin: parse the body, call ``django_controlplane.remote``, render. ``register_worker``,
``heartbeat_worker``, ``disconnect_worker`` and ``post_event`` are called by
the general views of ``/workers``, ``/workers/<id>`` and ``/jobs/<id>/events``
for the methods only remote workers use; claim, complete and fail have their
own views here (routed in ``remote_urls``). Every error has the one shape
``{"message", "errors"}``.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from rest_framework import permissions, serializers, status
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_controlplane import remote
from django_controlplane.api.defaults import ApiDefaults
from django_controlplane.api.errors import error_response
from django_controlplane.mount import mount_prefix
from jobs.claims import ClaimedJob
from jobs.conf import knob
from jobs.exceptions import IllegalTransition, JobCancelled, JobNotFound, LeaseLost
from jobs.failures import MAX_TRACEBACK_BYTES
from jobs.models import Worker
from jobs.operations import MAX_SCHEMA_BYTES, MAX_SCHEMA_DEPTH
from jobs.storable import MAX_DEPTH

PERMISSION = "controlplane.run_remote_jobs"
logger = logging.getLogger("django_controlplane.api")


class CanRunRemoteJobs(permissions.BasePermission):
    """Authenticated, and holding ``controlplane.run_remote_jobs``."""

    message = (
        "This account may not run remote workers; ask an administrator for the "
        "'controlplane.run_remote_jobs' permission."
    )

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        return bool(user and user.is_authenticated and user.has_perm(PERMISSION))


def _check_permission(request: Request) -> None:
    if not CanRunRemoteJobs().has_permission(request, None):
        raise PermissionDenied(CanRunRemoteJobs.message)


def remote_endpoint(handler: Callable[..., Response]) -> Callable[..., Response]:
    """Check the permission and render the protocol's errors in the one shape."""

    @functools.wraps(handler)
    def wrapper(request: Request, *args: Any, **kwargs: Any) -> Response:
        _check_permission(request)
        try:
            return handler(request, *args, **kwargs)
        except remote.RemoteRequestError as error:
            return error_response(error.message, error.status_code, error.errors)
        except JobCancelled as error:
            return error_response(str(error), status.HTTP_409_CONFLICT, {"status": ["cancelled"]})
        except LeaseLost as error:
            return error_response(
                str(error), status.HTTP_409_CONFLICT, {"status": [str(error.status or "")]}
            )
        except IllegalTransition as error:
            return error_response(str(error), status.HTTP_409_CONFLICT, {"status": [error.source]})
        except JobNotFound as error:
            return error_response(str(error), status.HTTP_404_NOT_FOUND)
        except ImproperlyConfigured as error:  # a malformed knob (REMOTE_WORKER_GRANTS)
            logger.error("remote-worker request refused: %s", error)
            return error_response(
                f"The control plane is misconfigured: {error}",
                status.HTTP_500_INTERNAL_SERVER_ERROR,
            )

    return wrapper


def _body(request: Request, serializer_class: type[serializers.Serializer]) -> dict[str, Any]:
    if not isinstance(request.data, dict):
        raise remote.RemoteRequestError("The request body must be a JSON object.")
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


def _job_id(value: Any) -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise JobNotFound(value) from None


# --- bodies -------------------------------------------------------------------------


class RegisterBody(serializers.Serializer):
    name = serializers.CharField(required=False, allow_blank=True, max_length=200, default="")
    queues = serializers.ListField(child=serializers.CharField(max_length=200), required=False)
    operations = serializers.JSONField(
        help_text="Operation names, or declarations {name, queue?, payload_schema?, "
        "max_attempts?}. A payload_schema is JSON Schema 2020-12 of at most "
        f"{MAX_SCHEMA_BYTES} bytes and {MAX_SCHEMA_DEPTH} levels; its $refs stay inside it "
        "and its patterns run on RE2 (no backreferences or lookaround)."
    )
    concurrency = serializers.IntegerField(required=False, min_value=1, max_value=1000, default=1)
    hostname = serializers.CharField(required=False, allow_blank=True, max_length=255, default="")
    pid = serializers.IntegerField(
        required=False, allow_null=True, default=None, min_value=0, max_value=2**31 - 1
    )


class HeldJob(serializers.Serializer):
    id = serializers.UUIDField()
    lease_token = serializers.UUIDField()


class HeartbeatBody(serializers.Serializer):
    # A ListField of HeldJob, not HeldJob(many=True): ``allow_null`` on a
    # many=True serializer reaches its items too, and ``[null]`` then came
    # through as a held job (a TypeError, a 500).
    held = serializers.ListField(
        child=HeldJob(),
        required=False,
        allow_null=True,
        default=None,
        max_length=10_000,
        help_text="The jobs the worker runs, each {id, lease_token}; null: the server's view.",
    )


class ClaimBody(serializers.Serializer):
    limit = serializers.IntegerField(required=False, min_value=1, max_value=1000, default=1)
    wait = serializers.FloatField(required=False, min_value=0, default=0)


class EventBody(serializers.Serializer):
    lease_token = serializers.CharField()
    event = serializers.CharField(max_length=200)
    message = serializers.CharField(required=False, allow_blank=True, default="")
    level = serializers.ChoiceField(choices=["info", "warning", "error"], default="info")
    fields = serializers.DictField(
        required=False,
        default=dict,
        help_text=f"At most {MAX_DEPTH} levels deep; _progress_current and _progress_total "
        "are whole numbers from 0 to 2147483647.",
    )


class CompleteBody(serializers.Serializer):
    lease_token = serializers.CharField()
    result = serializers.JSONField(
        required=False,
        allow_null=True,
        default=None,
        help_text=f"Any JSON value at most {MAX_DEPTH} levels deep, with no NUL character "
        "or lone surrogate in any string.",
    )
    deferred = serializers.BooleanField(required=False, default=False)


class FailBody(serializers.Serializer):
    lease_token = serializers.CharField()
    error_code = serializers.CharField(max_length=200)
    error_message = serializers.CharField(allow_blank=True)
    retryable = serializers.BooleanField(required=False, default=False)
    traceback = serializers.CharField(
        required=False,
        allow_blank=True,
        allow_null=True,
        default="",
        trim_whitespace=False,
        help_text="The formatted traceback of the failure, shown on the job's page; past "
        f"{MAX_TRACEBACK_BYTES} bytes its head and tail are kept. No NUL character or lone "
        "surrogate.",
    )


# --- renderings -----------------------------------------------------------------------


def worker_json(worker: Worker) -> dict[str, Any]:
    return {
        "id": str(worker.pk),
        "name": worker.name,
        "kind": worker.kind,
        "hostname": worker.hostname,
        "pid": worker.pid,
        "queues": list(worker.queues),
        "operations": list(worker.operations),
        "concurrency": worker.concurrency,
        "started_at": worker.started_at,
        "last_heartbeat": worker.last_heartbeat,
        # What the client needs to pace itself.
        "heartbeat_interval": float(knob("HEARTBEAT_SECONDS")),
        "lease_seconds": float(knob("LEASE_SECONDS")),
        "worker_timeout": float(knob("WORKER_TIMEOUT_SECONDS")),
        "poll_interval": float(knob("POLL_SECONDS")),
        "max_wait": remote.MAX_WAIT_SECONDS,
        "websocket": f"{mount_prefix()}ws/workers/{worker.pk}",
    }


def claimed_json(job: ClaimedJob) -> dict[str, Any]:
    return {
        "id": str(job.id),
        "operation": job.operation,
        "queue": job.queue,
        "payload": job.payload,
        "attempt": job.attempt,
        "attempts": job.attempt,
        "max_attempts": job.max_attempts,
        "parent": str(job.parent_id) if job.parent_id else None,
        "status": "running",
        "lease_token": str(job.lease_token),
        # The client's context reports cancelled once this many seconds have passed.
        "timeout_seconds": job.timeout_seconds,
        # The enqueuer's trace context ({"traceparent": …}): the parent of the run's span.
        "trace_context": job.trace_context,
    }


# --- handlers delegated by the general views --------------------------------------------


@remote_endpoint
def register_worker(request: Request) -> Response:  # POST /workers
    body = _body(request, RegisterBody)
    worker = remote.register_worker(user=request.user, **body)
    return Response(worker_json(worker), status=status.HTTP_201_CREATED)


@remote_endpoint
def heartbeat_worker(request: Request, worker_id: Any) -> Response:  # PATCH /workers/<id>
    body = _body(request, HeartbeatBody) if request.data else {"held": None}
    held = body.get("held")
    pairs = [(h["id"], h["lease_token"]) for h in held] if held is not None else None
    result = remote.heartbeat(worker_id=worker_id, user=request.user, held=pairs)
    return Response(
        {
            **worker_json(result.worker),
            "held": [str(i) for i in result.held],
            "lost": [str(i) for i in result.lost],
            "cancelled": [str(i) for i in result.cancelled],
            "timed_out": [str(i) for i in result.timed_out],
        }
    )


@remote_endpoint
def disconnect_worker(request: Request, worker_id: Any) -> Response:  # DELETE /workers/<id>
    requeued = remote.disconnect_worker(worker_id=worker_id, user=request.user)
    return Response({"id": str(worker_id), "requeued": [str(i) for i in requeued]})


@remote_endpoint
def post_event(request: Request, job_id: Any) -> Response:  # POST /jobs/<id>/events
    body = _body(request, EventBody)
    seq = remote.post_event(job_id=_job_id(job_id), user=request.user, **body)
    return Response({"job": str(job_id), "seq": seq}, status=status.HTTP_201_CREATED)


# --- routes only remote workers use --------------------------------------------------------


class RemoteView(ApiDefaults, APIView):
    permission_classes = [CanRunRemoteJobs]


class CompleteView(RemoteView):
    """POST /jobs/<id>/complete ``{lease_token, result?, deferred?}``."""

    @staticmethod
    @remote_endpoint
    def _complete(request: Request, job_id: str) -> Response:
        body = _body(request, CompleteBody)
        moved = remote.complete(job_id=_job_id(job_id), user=request.user, **body)
        return Response({"id": str(job_id), "status": moved.value})

    def post(self, request: Request, job_id: str) -> Response:
        return self._complete(request, job_id)


class FailView(RemoteView):
    """POST /jobs/<id>/fail ``{lease_token, error_code, error_message, retryable?, traceback?}``."""

    @staticmethod
    @remote_endpoint
    def _fail(request: Request, job_id: str) -> Response:
        body = _body(request, FailBody)
        moved = remote.fail(job_id=_job_id(job_id), user=request.user, **body)
        return Response({"id": str(job_id), "status": moved.value})

    def post(self, request: Request, job_id: str) -> Response:
        return self._fail(request, job_id)
