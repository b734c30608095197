"""Who holds a unique key now: the reads behind duplicate enqueues and refused retries.

``jobs.uniqueness`` defines the modes and the index's condition; these
functions query it (``HOLDS_KEY``, answered from ``job_unique_key_held``).
"""

from __future__ import annotations

from collections.abc import Iterable

from jobs.models import Job
from jobs.uniqueness import HOLDS_KEY, UniqueKeyHeld


def key_holders(keys: Iterable[str], *, using: str = "default") -> dict[str, Job]:
    """The job holding each of ``keys`` now, by key (keys no job holds are absent)."""
    wanted = set(keys)
    if not wanted:
        return {}
    rows = Job.objects.using(using).filter(HOLDS_KEY, unique_key__in=wanted).order_by()
    return {job.unique_key: job for job in rows if job.unique_key is not None}


def key_held_error(job_id: object, *, using: str = "default") -> UniqueKeyHeld | None:
    """Why a move of ``job_id`` back into its window broke the unique index, or None.

    None when the job has no key: the ``IntegrityError`` had another cause
    and the caller re-raises it.
    """
    key = Job.objects.using(using).filter(pk=job_id).values_list("unique_key", flat=True).first()
    if key is None:
        return None
    holder = key_holders([key], using=using).get(key)
    return UniqueKeyHeld(job_id=job_id, key=key, holder_id=holder.pk if holder else None)
