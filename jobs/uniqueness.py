"""Unique jobs: one key, held by at most one job at a time, while that job is in its window.

A job enqueued with a ``unique_key`` holds it while it is inside the window
its ``unique_while`` names:

- ``queued``: until a worker first starts it. A job that goes back to
  ``queued`` after it ran (a retry with backoff, a shutdown or lease
  requeue, a retry later) does not take the key again: it keeps its
  ``started_at``, which is what the index tests (``jobs.transitions``
  keeps it for these jobs only).
- ``active``: while it is queued or running.
- ``until_retention``: for as long as the row exists (the reaper's
  retention deletes it). ``idempotency_key`` is this mode's older name.

One partial unique index over ``unique_key`` (``job_unique_key_held``, its
condition is ``HOLDS_KEY``) enforces it, whatever the modes: keys form one
namespace and the holder's own mode says how long it keeps the key. An
enqueue whose key is held stores nothing and returns the holder.

An operator retry puts a failed or cancelled job back in its window; while
another job holds the key, the retry is refused with ``UniqueKeyHeld``
(409 in the API) rather than making a second holder.

The definitions are here (``jobs.models`` builds its index from them); the
reads that find a key's holder are in ``jobs.key_holders``.
"""

from __future__ import annotations

from django.db.models import Q

from jobs.exceptions import IllegalTransition
from jobs.states import QUEUED, RUNNING, TextChoices

MAX_KEY_LENGTH = 255


class UniqueWhile(TextChoices):
    # Until a worker first starts it: later requeues do not take the key again.
    QUEUED = "queued", "Until it first starts"
    # While it is queued or running.
    ACTIVE = "active", "While queued or running"
    # Until the row is deleted by retention (idempotency keys).
    UNTIL_RETENTION = "until_retention", "Until retention deletes it"


# A key without a mode takes this one: duplicates are kept out while one job
# is waiting or running, and the key is free again once it has ended.
DEFAULT_UNIQUE_WHILE = UniqueWhile.ACTIVE

# Whether a row holds its key now: the condition of the partial unique index,
# and the filter that finds the holder of a key (the same text, so PostgreSQL
# answers it from the index).
HOLDS_KEY = (
    Q(unique_while=UniqueWhile.UNTIL_RETENTION.value)
    | Q(unique_while=UniqueWhile.ACTIVE.value, status__in=[QUEUED.value, RUNNING.value])
    | Q(unique_while=UniqueWhile.QUEUED.value, status=QUEUED.value, started_at__isnull=True)
)


class UniqueKeyHeld(IllegalTransition):
    """A job cannot go back to ``queued``: another job holds its unique key."""

    def __init__(self, *, job_id: object, key: str, holder_id: object) -> None:
        self.source, self.target, self.job_id = "", QUEUED.value, job_id
        self.key, self.holder_id = key, holder_id
        holder = f"job {holder_id}" if holder_id else "another job"
        Exception.__init__(
            self,
            f"Job {job_id} was not retried: {holder} holds its unique key {key!r}. "
            "Let that job finish, or cancel it, and retry again.",
        )
