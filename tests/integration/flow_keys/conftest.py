"""Fixtures of the keyed tests with real processes: ``runworker``, a reaper, a daphne server,
and a reader of the runs the job events record."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest

from jobs import events
from jobs.conf import DEFAULTS

TEST_MODULES = ",".join([*DEFAULTS["OPERATION_MODULES"], "tests.ops"])

# The events that end a run: the job leaves ``running`` (jobs.states, CONTRACT "Job states").
RUN_ENDS = frozenset(
    {
        events.JOB_SUCCEEDED,
        events.JOB_FAILED,
        events.JOB_CANCELLED,
        events.JOB_RETRY_LATER,
        events.JOB_RETRY_SCHEDULED,
        events.JOB_REQUEUED,
        events.JOB_LEASE_EXPIRED_REQUEUE,
        events.JOB_LEASE_EXPIRED,
        events.JOB_OUTAGE_REQUEUE,
        events.JOB_TIMEOUT,
    }
)


@pytest.fixture
def worker(start_process) -> Callable[..., Any]:
    """Start ``runworker`` on the queues given, with the test operations loaded."""

    def start(*queues: str, args: tuple[str, ...] = (), env: dict | None = None) -> Any:
        flags = [a for q in (queues or ("default",)) for a in ("--queue", q)]
        return start_process(
            "runworker",
            *flags,
            *args,
            env={"CONTROLPLANE_OPERATION_MODULES": TEST_MODULES, **(env or {})},
        )

    return start


@dataclass(frozen=True)
class Run:
    """One run of a job as its events tell it: from ``job.started`` to the event that ended it."""

    job_id: Any
    keys: tuple[str, ...]
    started: datetime
    ended: datetime | None  # None: still running
    end_event: str | None


def runs_of(job_ids: Iterable[Any]) -> list[Run]:
    """Every run of the jobs, read from their timelines in ``seq`` order."""
    from jobs.models import Job, JobEvent

    ids = list(job_ids)
    keys = dict(Job.objects.filter(pk__in=ids).values_list("pk", "flow_keys"))
    timeline = (
        JobEvent.objects.filter(job_id__in=ids, event__in=[events.JOB_STARTED, *RUN_ENDS])
        .order_by("job_id", "seq")
        .values_list("job_id", "ts", "event")
    )
    runs: list[Run] = []
    open_runs: dict[Any, datetime] = {}
    for job_id, ts, event in timeline:
        if event == events.JOB_STARTED:
            assert job_id not in open_runs, f"job {job_id} started twice without an end between"
            open_runs[job_id] = ts
        elif job_id in open_runs:
            started = open_runs.pop(job_id)
            runs.append(Run(job_id, tuple(keys[job_id] or ()), started, ts, event))
    runs += [Run(j, tuple(keys[j] or ()), ts, None, None) for j, ts in open_runs.items()]
    return runs


def max_overlap_by_key(runs: Iterable[Run]) -> dict[str, int]:
    """The most runs of each key that overlapped at any instant (a sweep over starts and ends).

    A run that ended at the very instant another started does not overlap it:
    the claim that started the second counted running jobs after the first's
    end was committed (ends sort before starts at equal times).
    """
    points: dict[str, list[tuple[datetime, int]]] = defaultdict(list)
    for run in runs:
        for key in run.keys:
            points[key].append((run.started, 1))
            if run.ended is not None:
                points[key].append((run.ended, -1))
    most: dict[str, int] = {}
    for key, marks in points.items():
        level = peak = 0
        for _, step in sorted(marks):
            level += step
            peak = max(peak, level)
        most[key] = peak
    return most


@pytest.fixture(scope="module")
def remote_server(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[Any]:
    """A daphne server against the test database, for the remote-worker claims."""
    from tests.integration.remote.helpers import start_server

    with django_db_blocker.unblock():
        running = start_server(tmp_path_factory.mktemp("keyed-server"))
    yield running
    running.proc.stop()


@pytest.fixture
def remote_api(remote_server, transactional_db) -> Iterator[Any]:
    """An HTTP client of the server, signed in as an account that may run remote jobs."""
    import httpx
    from django.contrib.auth.models import Permission, User
    from rest_framework.authtoken.models import Token

    user = User.objects.create_user("keyed-remote")
    user.user_permissions.add(Permission.objects.get(codename="run_remote_jobs"))
    token = Token.objects.create(user=user).key
    with httpx.Client(
        base_url=remote_server.url,
        headers={"Authorization": f"Token {token}"},
        timeout=40,
        trust_env=False,
    ) as client:
        yield client
