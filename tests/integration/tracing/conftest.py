"""Fixtures of the tracing tests (``spans``: an SDK with an in-memory exporter; ``no_sdk``)."""

from . import ops  # noqa: F401 - registers the test operations in this process
from .spans import no_sdk, spans  # noqa: F401 - fixtures
