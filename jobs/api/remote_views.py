"""Remote-worker handlers called by the REST views for methods only remote workers use.

Each takes the DRF request (and ids) and returns a DRF Response.
"""

from __future__ import annotations

from rest_framework.response import Response


def _not_yet() -> Response:
    return Response({"message": "Remote workers are not available yet.", "errors": {}}, status=501)


def register_worker(request) -> Response:  # POST /workers
    return _not_yet()


def heartbeat_worker(request, worker_id) -> Response:  # PATCH /workers/<id>
    return _not_yet()


def disconnect_worker(request, worker_id) -> Response:  # DELETE /workers/<id>
    return _not_yet()


def post_event(request, job_id) -> Response:  # POST /jobs/<id>/events
    return _not_yet()
