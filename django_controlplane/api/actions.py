"""The API's operator actions: the domain services of ``jobs.operator_actions`` and
``jobs.bulk_actions``.

Kept for the API views' imports: bulk cancel and retry walk the matching
jobs in bounded batches and write one audit row; pausing a queue creates its
``Queue`` row on first use and writes its audit row.
"""

from __future__ import annotations

from typing import Any

from jobs import operator_actions
from jobs.bulk_actions import BULK_BATCH_SIZE, bulk_cancel, bulk_retry
from jobs.models import Queue

__all__ = ["BULK_BATCH_SIZE", "bulk_cancel", "bulk_retry", "set_queue_paused"]


def set_queue_paused(name: str, paused: bool, *, user: Any = None) -> Queue:
    """Pause or resume claiming on a queue (audited; resuming wakes its workers)."""
    return operator_actions.set_paused(name, paused, user=user)
