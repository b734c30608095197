"""Root URLs of the repository's deployment: the admin, and the control plane at ``/``."""

from django.contrib import admin
from django.urls import include, path

# JSON errors on the API's paths for requests no view answered; HTML elsewhere.
from django_controlplane.urls import handler400, handler403, handler404, handler500  # noqa: F401

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("django_controlplane.urls")),
]
