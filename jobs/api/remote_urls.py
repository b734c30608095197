"""Routes only remote workers use: claim, complete, fail (with or without a trailing slash).

Register, heartbeat, disconnect and events share their paths with the general
views (``jobs.api.views``), which hand those methods to ``remote_views``.
"""

from django.urls import re_path

from jobs.api import claim_view, remote_views

urlpatterns = [
    re_path(
        r"^workers/(?P<worker_id>[^/]+)/claim/?$",
        claim_view.ClaimView.as_view(),
        name="worker-claim",
    ),
    re_path(
        r"^jobs/(?P<job_id>[^/]+)/complete/?$",
        remote_views.CompleteView.as_view(),
        name="job-complete",
    ),
    re_path(r"^jobs/(?P<job_id>[^/]+)/fail/?$", remote_views.FailView.as_view(), name="job-fail"),
]
