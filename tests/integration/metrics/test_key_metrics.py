"""GET /metrics exports the jobs flow keys hold back, per queue and key family (never per key).

Keys are at their limit for real: jobs enqueued with ``keys=`` and started by the keyed
claim in-process. Both databases.
"""

from __future__ import annotations

import pytest

from jobs import operator_actions
from jobs.enqueue import JobSpec, enqueue_many
from jobs.key_limits import cache
from jobs.keyed_claims import claim_keyed
from jobs.models import Worker
from tests.factories import unique_queue

from .conftest import scrape, value

pytestmark = pytest.mark.django_db

HELD = "controlplane_key_held_back_jobs"
AT_LIMIT = "controlplane_keys_at_limit"


@pytest.fixture(autouse=True)
def _fresh_limits():
    cache.forget()
    yield
    cache.forget()


def start(queue: str) -> int:
    worker = Worker.objects.create(name="key-metrics", queues=[queue])
    return len(claim_keyed(queue=queue, worker_id=worker.id, limit=50, lease_seconds=60).jobs)


def test_held_back_jobs_and_keys_at_their_limit_by_family(api_for):
    queue = unique_queue("keys")
    operator_actions.set_key_limits("acct", {"concurrency": 1}, user="test")
    operator_actions.set_key_limits("api", {"rate": 0.01, "burst": 1}, user="test")
    operator_actions.set_key_limits("idle", {"concurrency": 5}, user="test")
    specs = [JobSpec("ping", queue=queue, keys=[f"acct:{i}"]) for i in range(3) for _ in range(3)]
    specs += [JobSpec("ping", queue=queue, keys=["api:7"]) for _ in range(4)]
    enqueue_many(specs)
    assert start(queue) == 4  # one per account, one token of api:7

    samples = scrape(api_for("viewer"))
    assert value(samples, HELD, queue=queue, family="acct") == 6
    assert value(samples, AT_LIMIT, queue=queue, family="acct") == 3
    assert value(samples, HELD, queue=queue, family="api") == 3
    assert value(samples, AT_LIMIT, queue=queue, family="api") == 1
    # A limited family holding nothing back reads 0 rather than vanishing.
    assert value(samples, HELD, queue=queue, family="idle") == 0
    assert value(samples, AT_LIMIT, queue=queue, family="idle") == 0
    # Labels are queue and family only: no key reaches a label.
    labels = {k for name in (HELD, AT_LIMIT) for series in samples[name] for k, _ in series}
    assert labels == {"queue", "family"}
    assert not any(
        ":" in v for name in (HELD, AT_LIMIT) for series in samples[name] for _, v in series
    )


def test_without_keyed_queues_the_gauges_are_empty(api_for):
    samples = scrape(api_for("viewer"))
    assert not samples.get(HELD) and not samples.get(AT_LIMIT)
