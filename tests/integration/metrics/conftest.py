"""Fixtures for the metrics tests: real worker and reaper processes, a scraping client."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobs.conf import DEFAULTS
from tests.conftest import wait_for
from tests.integration.api.conftest import Api, api_for, make_user  # noqa: F401 - fixtures

TEST_MODULES = ",".join([*DEFAULTS["OPERATION_MODULES"], "tests.ops"])
# The rollup reads events as soon as they are written (no settle time) in every process.
METRICS_KNOBS = {"CONTROLPLANE_METRICS_SETTLE_SECONDS": "0"}


@pytest.fixture
def burst(start_process) -> Callable[..., list[str]]:
    """Run ``runworker --burst`` processes at once on ``queues`` and wait until all exit 0;
    return their outputs."""

    def run(*queues: str, processes: int = 1, env: dict[str, str] | None = None) -> list[str]:
        flags = [a for q in queues for a in ("--queue", q)]
        started = [
            start_process(
                "runworker",
                *flags,
                "--burst",
                env={"CONTROLPLANE_OPERATION_MODULES": TEST_MODULES, **(env or {})},
            )
            for _ in range(processes)
        ]
        for proc in started:
            assert proc.wait(timeout=60) == 0, proc.output()
        return [proc.output() for proc in started]

    return run


@pytest.fixture
def drain(burst) -> Callable[..., None]:
    """Run burst workers until every job of ``queues`` that is due has finished (retries
    with a backoff come due between runs); bounded."""
    from django.utils import timezone

    from jobs.models import Job
    from jobs.states import ACTIVE

    def run(*queues: str, processes: int = 1) -> None:
        def done() -> bool:
            pending = Job.objects.filter(queue__in=queues, status__in=ACTIVE)
            if not pending.filter(run_after__lte=timezone.now() + _soon()).exists():
                return True
            burst(*queues, processes=processes)
            return False

        wait_for(done, timeout=90, interval=0.05, message=f"the jobs of {queues} to finish")

    return run


def _soon():
    from datetime import timedelta

    return timedelta(seconds=5)


def scrape(api: Api, **headers: str) -> dict[str, dict[tuple, float]]:
    """GET /metrics and parse it with prometheus_client: {sample name: {labels: value}}."""
    response = api.client.get("/metrics", headers={**api.headers, **headers})
    assert response.status_code == 200, response.content[:500]
    assert response["Content-Type"].startswith("text/plain; version=0.0.4"), response[
        "Content-Type"
    ]
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def value(samples: dict[str, dict[tuple, float]], name: str, **labels: str) -> float | None:
    return samples.get(name, {}).get(tuple(sorted(labels.items())))
