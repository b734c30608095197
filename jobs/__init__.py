"""Jobs: the models, the state machine, operations and enqueue.

A host project adds the control plane through ``django_controlplane``
(``APPS``, ``configure``); ``CONTROLPLANE_APPS`` is the name that list had
before, kept for settings files written against it.
"""

from __future__ import annotations

import warnings
from typing import Any


def __getattr__(name: str) -> Any:
    if name == "CONTROLPLANE_APPS":
        warnings.warn(
            "jobs.CONTROLPLANE_APPS is now django_controlplane.APPS; end settings.py with "
            "django_controlplane.configure(globals()) to add them and the rest.",
            DeprecationWarning,
            stacklevel=2,
        )
        from django_controlplane import APPS

        return APPS
    raise AttributeError(f"module 'jobs' has no attribute {name!r}")
