"""Jobs: the core of the control plane (models, the state machine, operations, enqueue, reads).

It imports none of the faces that serve it (``django_controlplane``: the REST API,
the remote-worker protocol, web serving, the admin, the commands; ``dashboard``).
A host project adds the whole control plane through ``django_controlplane``.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "CONTROLPLANE_APPS":  # the list's name before django_controlplane existed
        raise AttributeError(
            "jobs.CONTROLPLANE_APPS is now django_controlplane.APPS; end settings.py with "
            "django_controlplane.configure(globals()) to add them and the rest."
        )
    raise AttributeError(f"module 'jobs' has no attribute {name!r}")
