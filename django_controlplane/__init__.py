"""The control plane inside a Django project: the few names a host project uses.

``settings.py`` (last line)::

    import django_controlplane
    django_controlplane.configure(globals())

``urls.py``: ``path("ops/", include("django_controlplane.urls"))`` (any prefix);
``asgi.py``: ``from django_controlplane.asgi import application``.

``configure`` adds the apps in ``APPS``, the middleware, the database options,
the static files, the sign-in page and the logging the control plane needs,
leaving every value the project set itself as it was; ``manage.py check``
says what is still missing and how to add it (``django_controlplane.checks``).
The repository's own deployment, ``controlplane/``, is a host project built
from exactly these names.

Importing this module first makes sure that the control plane's top-level
packages (``jobs``, ``workers``, ``dashboard``) are the installed ones and not
a project's own packages of the same names, which would shadow them.
"""

from __future__ import annotations

from django_controlplane.packages import ensure_not_shadowed

ensure_not_shadowed()

from django_controlplane.host_settings import APPS, configure  # noqa: E402

__all__ = ["APPS", "configure"]
