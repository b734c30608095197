"""An operation with its schedule beside it; loaded only by the reapers of test_reapers."""

from jobs.operations import operation


@operation(
    "test.scheduled_hourly",
    queue="scheduled-in-code",
    schedule={"every_seconds": 3600, "catch_up": "none", "overlap": "skip"},
)
def scheduled_hourly(ctx, payload):
    """Does nothing, once an hour."""
    return None
