"""ASGI entry point (``daphne controlplane.asgi:application``), as the README's recipe writes it."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

from django_controlplane.asgi import application  # noqa: E402, F401
