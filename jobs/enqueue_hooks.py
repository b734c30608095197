"""Callbacks that run right after a successful enqueue, in the enqueuing thread.

One use: ``django_controlplane.testing.run_jobs_at_once`` (a host's tests run
each job as soon as it is enqueued). ``jobs.enqueue.enqueue_many`` calls
``after_enqueue`` with the jobs it returns; with no callback registered that
is one truth test of an empty list, so the hot path pays nothing else.

There is deliberately no setting that turns a callback on: only code that
registers one (and removes it again) changes what an enqueue does, so a
deployment cannot switch it on by configuration.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jobs.models import Job

# (jobs as returned by the enqueue, the database alias they were stored with)
AfterEnqueue = Callable[[Sequence["Job"], str], None]

_callbacks: list[AfterEnqueue] = []


def add_after_enqueue(callback: AfterEnqueue) -> Callable[[], None]:
    """Register ``callback``; returns the function that removes it again.

    Duplicates (``job.duplicate``: a held unique key returned its holder) are
    among the jobs the callback receives; it decides what to do with them.
    An exception from a callback reaches the enqueue's caller, after the
    jobs were stored.
    """
    _callbacks.append(callback)

    def remove() -> None:
        if callback in _callbacks:
            _callbacks.remove(callback)

    return remove


def after_enqueue(jobs: list[Job], using: str) -> list[Job]:
    """Run every registered callback on ``jobs``; returns ``jobs`` unchanged."""
    if _callbacks:
        for callback in list(_callbacks):
            callback(jobs, using)
    return jobs
