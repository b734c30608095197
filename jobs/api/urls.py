"""REST routes (CONTRACT.md). Every route answers with and without a trailing slash."""

from django.urls import include, path

urlpatterns = [
    path("", include("jobs.api.remote_urls")),
]
