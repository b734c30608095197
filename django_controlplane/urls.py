"""Everything the control plane serves over HTTP, as one URLconf to mount.

A host project adds ``path("ops/", include("django_controlplane.urls"))`` (any prefix, or
``""``): the dashboard is then at ``ops/dashboard/``, the REST API at
``ops/jobs``, ``ops/queues``… and ``ops/`` itself sends people to the
dashboard. Links, redirects, the API's ``next`` URLs and the WebSocket paths
handed to browsers and remote workers all follow the prefix (``django_controlplane.mount``).

A project's root URLconf may also take ``handler400`` … ``handler500`` from
here: requests under the API's paths that no view answered (refused by a
middleware, an unexpected crash) then get the API's JSON error shape, and every
other path keeps Django's pages.
"""

from __future__ import annotations

from django.urls import include, path, re_path

from django_controlplane.api.errors import (  # noqa: F401 (the handlers: for a project's root URLconf)
    API_PREFIXES,
    api_not_found,
    handler400,
    handler403,
    handler404,
    handler500,
)

urlpatterns = [
    path("", include("dashboard.urls")),
    path("", include("django_controlplane.api.urls")),
    # Last: an unknown path under an API prefix is a JSON 404 even with DEBUG on.
    re_path(rf"^(?:{'|'.join(API_PREFIXES)})(?:/.*)?$", api_not_found),
]
