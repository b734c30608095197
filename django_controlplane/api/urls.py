"""REST routes (docs/rest-api.md). Every route answers with and without a trailing slash.

Order matters: the remote workers' own routes (``/jobs/<id>/complete`` …)
come first, and ``/jobs/cancel`` and ``/jobs/retry`` (bulk) come before
``/jobs/<id>``, which only ever matches one path segment.
"""

from django.urls import include, path, re_path

from django_controlplane.api import (
    key_views,
    log_views,
    operation_views,
    queue_views,
    schedule_views,
    schema,
    views,
    worker_views,
    workflow_views,
)
from django_controlplane.api.long_poll import long_poll_view
from django_controlplane.api.metrics_view import MetricsView


def both(route: str, view, name: str) -> list:
    """The route with and without its trailing slash (no redirect between them)."""
    return [path(route, view, name=name), path(f"{route}/", view)]


app_name = "controlplane_api"  # names that cannot clash with a host project's own

urlpatterns = [
    path("", include("django_controlplane.remote.urls")),
    *both("jobs", views.JobListView.as_view(), "job-list"),
    *both("jobs/cancel", views.BulkCancelView.as_view(), "job-bulk-cancel"),
    *both("jobs/retry", views.BulkRetryView.as_view(), "job-bulk-retry"),
    # ``?wait=S`` parks on the event loop until the job ends (long_poll_view: an async twin).
    *both("jobs/<str:job_id>", long_poll_view(views.JobDetailView), "job-detail"),
    *both("jobs/<str:job_id>/events", views.JobEventsView.as_view(), "job-events"),
    *both("jobs/<str:job_id>/logs", log_views.JobLogsView.as_view(), "job-logs"),
    *both("jobs/<str:job_id>/cancel", views.JobCancelView.as_view(), "job-cancel"),
    *both("jobs/<str:job_id>/retry", views.JobRetryView.as_view(), "job-retry"),
    *both(
        "jobs/<str:job_id>/dependencies",
        workflow_views.JobDependenciesView.as_view(),
        "job-dependencies",
    ),
    *both("workflows", workflow_views.WorkflowListView.as_view(), "workflow-list"),
    *both(
        "workflows/<str:workflow_id>",
        long_poll_view(workflow_views.WorkflowDetailView),
        "workflow-detail",
    ),
    *both(
        "workflows/<str:workflow_id>/cancel",
        workflow_views.WorkflowCancelView.as_view(),
        "workflow-cancel",
    ),
    *both("queues", queue_views.QueueListView.as_view(), "queue-list"),
    *both("queues/<str:name>", queue_views.QueueDetailView.as_view(), "queue-detail"),
    *both("queues/<str:name>/pause", queue_views.QueuePauseView.as_view(), "queue-pause"),
    *both("queues/<str:name>/resume", queue_views.QueueResumeView.as_view(), "queue-resume"),
    *both("keys", key_views.KeyLimitListView.as_view(), "key-list"),
    # A key name may hold '/' and any other character (not ``<str:…>``, nor ``<path:…>``,
    # whose '.' stops at a line break): one pattern serves both spellings, and the view
    # drops the trailing slash.
    re_path(r"^keys/(?P<name>[\s\S]+)$", key_views.KeyLimitDetailView.as_view(), name="key-detail"),
    *both("operations", operation_views.OperationListView.as_view(), "operation-list"),
    *both("schedules", schedule_views.ScheduleListView.as_view(), "schedule-list"),
    *both(
        "schedules/<str:schedule_id>",
        schedule_views.ScheduleDetailView.as_view(),
        "schedule-detail",
    ),
    *both(
        "schedules/<str:schedule_id>/pause",
        schedule_views.SchedulePauseView.as_view(),
        "schedule-pause",
    ),
    *both(
        "schedules/<str:schedule_id>/resume",
        schedule_views.ScheduleResumeView.as_view(),
        "schedule-resume",
    ),
    *both(
        "schedules/<str:schedule_id>/run", schedule_views.ScheduleRunView.as_view(), "schedule-run"
    ),
    *both("workers", worker_views.WorkerListView.as_view(), "worker-list"),
    *both("workers/<str:worker_id>", worker_views.WorkerDetailView.as_view(), "worker-detail"),
    *both("metrics", MetricsView.as_view(), "metrics"),
    *both("schema", schema.SchemaView.as_view(), "schema"),
    *both("schema/docs", schema.SchemaDocsView.as_view(), "schema-docs"),
]
