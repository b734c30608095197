"""Root URLs: the admin, sign-in, the dashboard and the REST API.

The REST API's paths (``/jobs``, ``/queues``, ``/workers``, ``/schema``)
answer every error in JSON (``jobs.api.errors``); the error handlers below
fall back to Django's HTML pages for every other path.
"""

from django.contrib import admin
from django.urls import include, path, re_path

from jobs.api.errors import API_PREFIXES, api_not_found

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("", include("dashboard.urls")),
    path("", include("jobs.api.urls")),
    # Last: an unknown path under an API prefix is a JSON 404 even with DEBUG on.
    re_path(rf"^(?:{'|'.join(API_PREFIXES)})(?:/.*)?$", api_not_found),
]

handler400 = "jobs.api.errors.handler400"
handler403 = "jobs.api.errors.handler403"
handler404 = "jobs.api.errors.handler404"
handler500 = "jobs.api.errors.handler500"
