"""``POST /jobs/<id>/logs``: a remote worker's execution log, in batches.

The SDK (``controlplane_client``) buffers what a remote operation logs and
sends it here every second or so; the bounds of a local worker's capture
hold here, counted on the server (``jobs.job_logs.append_logs``), whatever
the client does.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from django_controlplane.remote.errors import RemoteRequestError
from django_controlplane.remote.runs import _held_token
from django_controlplane.remote.views import _body, _job_id, remote_endpoint
from jobs.job_logs import SOURCE_REMOTE, LogRecord, append_logs
from jobs.storable import printable

# Records one request may carry; a client sends more in several.
MAX_RECORDS_PER_REQUEST = 1000
# A record's age is how long before the request it was made: at most a day.
MAX_AGE_SECONDS = 86_400.0
LEVELS = {
    "debug": "info",
    "info": "info",
    "warning": "warning",
    "error": "error",
    "critical": "error",
}


class LogRecordBody(serializers.Serializer):
    message = serializers.CharField(allow_blank=True, trim_whitespace=False)
    level = serializers.CharField(required=False, default="info", max_length=20)
    logger = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=200, trim_whitespace=False
    )
    age = serializers.FloatField(
        required=False,
        default=0.0,
        min_value=0.0,
        help_text="Seconds between the record and this request (the worker's own clock "
        "measures it; the server stamps the record with its time less the age).",
    )

    def validate_level(self, value: str) -> str:
        if value.lower() not in LEVELS:
            raise serializers.ValidationError(
                f"The level must be one of {', '.join(LEVELS)} (any case)."
            )
        return value.lower()


class LogsBody(serializers.Serializer):
    lease_token = serializers.CharField()
    records = serializers.ListField(
        child=LogRecordBody(), max_length=MAX_RECORDS_PER_REQUEST, allow_empty=True
    )
    dropped_records = serializers.IntegerField(required=False, default=0, min_value=0)
    dropped_bytes = serializers.IntegerField(required=False, default=0, min_value=0)


@remote_endpoint
def post_logs(request: Request, job_id: Any) -> Response:  # POST /jobs/<id>/logs
    body = _body(request, LogsBody)
    held = _job_id(job_id)
    if not body["records"] and not body["dropped_records"]:
        raise RemoteRequestError(
            "Nothing to write: send at least one record in 'records'.",
            {"records": ["Send at least one record."]},
        )
    token = _held_token(held, body["lease_token"], request.user)
    records = [
        LogRecord(
            level=LEVELS[item["level"]],
            # printable: a NUL or lone surrogate is shown replaced, never refused.
            message=printable(item["message"]),
            logger=printable(item["logger"]),
            levelname=item["level"].upper(),
            source=SOURCE_REMOTE,
            age=min(item["age"], MAX_AGE_SECONDS),
        )
        for item in body["records"]
    ]
    appended = append_logs(
        held,
        lease_token=token,
        records=records,
        dropped_records=body["dropped_records"],
        dropped_bytes=body["dropped_bytes"],
    )
    return Response(
        {
            "job": str(held),
            "stored": appended.stored,
            "dropped": appended.dropped,
            "truncated": appended.truncated,
        },
        status=status.HTTP_201_CREATED,
    )
