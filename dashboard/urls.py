"""Dashboard routes. The mount point sends people to the overview; everything else needs a login.

The sign-in page is the dashboard's own (``accounts/login/`` under the mount
point, ``configure`` makes it ``LOGIN_URL``): any active account signs in
there, not only staff as on the admin's, and what it may see is then decided
by its permissions (``dashboard.permissions``).
"""

from django.contrib.auth import views as auth_views
from django.urls import path
from django.views.generic import RedirectView

from dashboard.login import ThrottledLoginView
from dashboard.views import actions, jobs, keys, metrics, operations, pages, schedules, workflows

app_name = "dashboard"

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="dashboard:overview"), name="root"),
    path(
        "accounts/login/",
        ThrottledLoginView.as_view(),
        name="login",
    ),
    path(
        "accounts/logout/",
        auth_views.LogoutView.as_view(next_page="dashboard:login"),
        name="logout",
    ),
    path("dashboard", RedirectView.as_view(pattern_name="dashboard:overview")),
    path("dashboard/", pages.overview, name="overview"),
    path("dashboard/workers/", pages.workers, name="workers"),
    path("dashboard/queues/", pages.queues, name="queues"),
    path("dashboard/metrics/", metrics.metrics, name="metrics"),
    path("dashboard/operations/", operations.operations, name="operations"),
    path("dashboard/operations/enqueue/", operations.enqueue, name="operations-enqueue"),
    path("dashboard/schedules/", schedules.schedule_list, name="schedules"),
    path("dashboard/schedules/new/", schedules.create, name="schedule-create"),
    path("dashboard/schedules/<uuid:schedule_id>/", schedules.schedule_page, name="schedule"),
    path("dashboard/schedules/<uuid:schedule_id>/pause/", schedules.pause, name="schedule-pause"),
    path(
        "dashboard/schedules/<uuid:schedule_id>/resume/", schedules.resume, name="schedule-resume"
    ),
    path("dashboard/schedules/<uuid:schedule_id>/run/", schedules.run_now, name="schedule-run"),
    path("dashboard/workflows/", workflows.workflow_list, name="workflows"),
    path("dashboard/workflows/<uuid:workflow_id>/", workflows.workflow_detail, name="workflow"),
    path(
        "dashboard/workflows/<uuid:workflow_id>/live/",
        workflows.workflow_live,
        name="workflow-live",
    ),
    path(
        "dashboard/workflows/<uuid:workflow_id>/cancel/",
        workflows.cancel,
        name="workflow-cancel",
    ),
    path("dashboard/jobs/", jobs.job_list, name="jobs"),
    path("dashboard/jobs/live/", jobs.job_list_live, name="jobs-live"),
    path("dashboard/jobs/count/", jobs.job_list_count, name="jobs-count"),
    path("dashboard/jobs/bulk/", actions.bulk, name="bulk"),
    path("dashboard/jobs/<uuid:job_id>/", jobs.job_page, name="job"),
    path("dashboard/jobs/<uuid:job_id>/live/", jobs.job_live, name="job-live"),
    path("dashboard/jobs/<uuid:job_id>/earlier/", jobs.job_earlier, name="job-earlier"),
    path("dashboard/jobs/<uuid:job_id>/cancel/", actions.cancel, name="cancel"),
    path("dashboard/jobs/<uuid:job_id>/retry/", actions.retry, name="retry"),
    path("dashboard/jobs/<uuid:job_id>/requeue/", actions.requeue, name="requeue"),
    path("dashboard/jobs/<uuid:job_id>/run-now/", actions.run_now, name="run-now"),
    path("dashboard/jobs/<uuid:job_id>/discard/", actions.discard, name="discard"),
    path("dashboard/queues/pause/", actions.pause, name="pause"),
    path("dashboard/queues/resume/", actions.resume, name="resume"),
    path("dashboard/queues/cap/", actions.set_cap, name="cap"),
    path("dashboard/queues/rate/", actions.set_rate_limit, name="rate-limit"),
    path("dashboard/queues/retention/", actions.set_retention, name="retention"),
    path("dashboard/queues/keys/", keys.set_key_limits, name="key-limits"),
    path("dashboard/queues/keys/remove/", keys.delete_key_limits, name="key-limits-remove"),
]
