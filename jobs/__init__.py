"""Jobs: the models, the state machine, operations and enqueue.

``CONTROLPLANE_APPS`` is what a host project adds to ``INSTALLED_APPS`` (README,
"Adding it to your Django project"); this module imports nothing else, so a
settings file may import it.
"""

CONTROLPLANE_APPS = [
    # Before "channels": our runworker replaces Channels' command of that name.
    "workers",
    "jobs",
    "dashboard",
    "rest_framework",
    "rest_framework.authtoken",
    "channels",
    "drf_spectacular",
    "drf_spectacular_sidecar",
]
