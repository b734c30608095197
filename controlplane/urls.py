from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("", include("dashboard.urls")),
    path("", include("jobs.api.urls")),
]

handler404 = "jobs.api.errors.handler404"
handler500 = "jobs.api.errors.handler500"
