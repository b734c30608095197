"""An operations module found through settings ``CONTROLPLANE["OPERATION_MODULES"]``."""

from __future__ import annotations

from jobs.operations import operation

NAME = "foundation.discovered"


@operation(NAME, queue="discovered", payload_schema={"type": "object"})
def discovered(ctx, payload):
    """Returns what it was given."""
    return payload
