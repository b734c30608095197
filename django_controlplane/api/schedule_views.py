"""Schedule routes: list, create, read, change, delete, pause, resume, run now.

Thin views over ``jobs.schedules`` (services for writes, selectors for
reads). Reading needs ``controlplane.view_job``, every write
``controlplane.change_job``; writes are recorded in the operators' audit log.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, PolymorphicProxySerializer
from rest_framework import status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from django_controlplane.api.base import ApiView, bounded, error_responses
from django_controlplane.api.defaults import extend_schema
from django_controlplane.api.errors import error_response
from django_controlplane.api.permissions import CHANGE, VIEW
from django_controlplane.api.schedule_serializers import (
    ScheduleCreateSerializer,
    ScheduleDetailSerializer,
    SchedulePageSerializer,
    ScheduleSerializer,
    ScheduleUpdateSerializer,
    StartedWorkflowSerializer,
    schedule_json,
    started_workflow_json,
)
from django_controlplane.api.serializers import JobSerializer
from jobs.models import Job, Schedule, Workflow
from jobs.schedules import selectors, services
from jobs.schedules.definitions import ScheduleInvalid

SCHEDULE_ID = OpenApiParameter("schedule_id", OpenApiTypes.UUID, OpenApiParameter.PATH)
TAGS = ["schedules"]


def _read(schedule_id: Any) -> dict[str, Any]:
    schedule = selectors.schedule_get(schedule_id)
    if schedule is None:
        raise NotFound(f"No schedule with id {schedule_id} exists.")
    return schedule_json(schedule, selectors.schedule_history(schedule.pk))


def _summary(schedule: Schedule) -> dict[str, Any]:
    found = selectors.schedule_get(schedule.pk)
    return schedule_json(found if found is not None else schedule)


def _checked(serializer_class: type, data: Any) -> dict[str, Any]:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


def _act(action: Any) -> Any:
    """Run a service call, its refusals turned into the API's answers."""
    try:
        return action()
    except services.ScheduleNotFound as error:
        raise NotFound(str(error)) from None
    except ScheduleInvalid as error:
        raise ValidationError(error.errors) from None
    except services.ScheduleInCode as error:
        return error_response(str(error), status.HTTP_409_CONFLICT)


class ScheduleListView(ApiView):
    required_permissions = {"GET": VIEW, "POST": CHANGE}

    @extend_schema(
        operation_id="schedules_list",
        summary="Every schedule, by name, with its last outcome",
        responses={200: SchedulePageSerializer, **error_responses(401, 403, 503)},
        tags=TAGS,
    )
    @bounded
    def get(self, request: Request) -> Response:
        return Response({"results": [schedule_json(s) for s in selectors.schedule_list()]})

    @extend_schema(
        operation_id="schedules_create",
        summary="Create a schedule",
        description="Exactly one of operation and workflow, and one of cron and every_seconds. "
        "Its first fire is the first slot after now.",
        request=ScheduleCreateSerializer,
        responses={201: ScheduleSerializer, **error_responses(400, 401, 403, 413)},
        tags=TAGS,
    )
    def post(self, request: Request) -> Response:
        values = _checked(ScheduleCreateSerializer, self.body(request))
        paused = bool(values.pop("paused", False))
        made = _act(lambda: services.create_schedule(values, by=request.user, paused=paused))
        return Response(_summary(made), status=status.HTTP_201_CREATED)


class ScheduleDetailView(ApiView):
    required_permissions = {"GET": VIEW, "PATCH": CHANGE, "DELETE": CHANGE}

    @extend_schema(
        operation_id="schedules_retrieve",
        summary="One schedule with its recent fires",
        parameters=[SCHEDULE_ID],
        responses={200: ScheduleDetailSerializer, **error_responses(401, 403, 404)},
        tags=TAGS,
    )
    def get(self, request: Request, schedule_id: str) -> Response:
        return Response(_read(schedule_id))

    @extend_schema(
        operation_id="schedules_update",
        summary="Change a schedule",
        description="A new cron, interval or time zone fires from the first slot after now. "
        "Schedules declared in code answer 409: change them in the code.",
        parameters=[SCHEDULE_ID],
        request=ScheduleUpdateSerializer,
        responses={200: ScheduleDetailSerializer, **error_responses(400, 401, 403, 404, 409, 413)},
        tags=TAGS,
    )
    def patch(self, request: Request, schedule_id: str) -> Response:
        values = _checked(ScheduleUpdateSerializer, self.body(request))
        done = _act(lambda: services.update_schedule(schedule_id, values, by=request.user))
        if isinstance(done, Response):
            return done
        return Response(_read(done.pk))

    @extend_schema(
        operation_id="schedules_destroy",
        summary="Delete a schedule",
        description="Its fired jobs stay (and keep running); their schedule becomes null.",
        parameters=[SCHEDULE_ID],
        responses={204: None, **error_responses(401, 403, 404, 409)},
        tags=TAGS,
    )
    def delete(self, request: Request, schedule_id: str) -> Response:
        done = _act(lambda: services.delete_schedule(schedule_id, by=request.user))
        if isinstance(done, Response):
            return done
        return Response(status=status.HTTP_204_NO_CONTENT)


class SchedulePauseView(ApiView):
    required_permissions = {"POST": CHANGE}

    @extend_schema(
        operation_id="schedules_pause",
        summary="Stop firing a schedule",
        parameters=[SCHEDULE_ID],
        request=None,
        responses={200: ScheduleSerializer, **error_responses(401, 403, 404)},
        tags=TAGS,
    )
    def post(self, request: Request, schedule_id: str) -> Response:
        done = _act(lambda: services.pause_schedule(schedule_id, by=request.user))
        return Response(_summary(done))


class ScheduleResumeView(ApiView):
    required_permissions = {"POST": CHANGE}

    @extend_schema(
        operation_id="schedules_resume",
        summary="Fire a schedule again",
        description="From the first slot after now: what was missed while paused is skipped.",
        parameters=[SCHEDULE_ID],
        request=None,
        responses={200: ScheduleSerializer, **error_responses(401, 403, 404)},
        tags=TAGS,
    )
    def post(self, request: Request, schedule_id: str) -> Response:
        done = _act(lambda: services.resume_schedule(schedule_id, by=request.user))
        return Response(_summary(done))


class ScheduleRunView(ApiView):
    required_permissions = {"POST": CHANGE}

    @extend_schema(
        operation_id="schedules_run",
        summary="Fire a schedule once now",
        description="Paused or not, whatever its overlap policy; its own slots are untouched. "
        "Answers the job it enqueued, or for a workflow schedule the workflow it started.",
        parameters=[SCHEDULE_ID],
        request=None,
        responses={
            201: PolymorphicProxySerializer(
                component_name="ScheduleRun",
                serializers=[JobSerializer, StartedWorkflowSerializer],
                resource_type_field_name=None,
            ),
            **error_responses(400, 401, 403, 404),
        },
        tags=TAGS,
    )
    def post(self, request: Request, schedule_id: str) -> Response:
        made = _act(lambda: services.run_schedule_now(schedule_id, by=request.user))
        if isinstance(made, Workflow):
            return Response(started_workflow_json(made), status=status.HTTP_201_CREATED)
        return Response(
            JobSerializer(Job.objects.get(pk=made.pk)).data, status=status.HTTP_201_CREATED
        )
