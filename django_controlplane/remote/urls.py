"""Routes only remote workers use: claim, complete, fail (with or without a trailing slash).

Register, heartbeat, disconnect and events share their paths with the general
views (``django_controlplane.api.views``), which hand those methods to ``remote_views``.
"""

from django.urls import re_path

from django_controlplane.remote import claim_view
from django_controlplane.remote import views as remote_views

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
