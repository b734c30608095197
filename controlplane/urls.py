"""Root URLs of the ready-to-run deployment: the admin, sign-in, and the control plane at ``/``.

The REST API's paths (``/jobs``, ``/queues``, ``/workers``, ``/schema``)
answer every error in JSON (``jobs.api.errors``); the error handlers below
fall back to Django's HTML pages for every other path.
"""

from django.contrib import admin
from django.urls import include, path

# The admin's pages as Django's AdminConfig would find them; this project's
# config (controlplane.apps.AdminConfig) leaves discovery to where it is used.
admin.autodiscover()

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("", include("jobs.urls")),
]

handler400 = "jobs.api.errors.handler400"
handler403 = "jobs.api.errors.handler403"
handler404 = "jobs.api.errors.handler404"
handler500 = "jobs.api.errors.handler500"
