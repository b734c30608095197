from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection


@pytest.fixture(scope="package", autouse=True)
def _partitioned_events(django_db_setup, django_db_blocker) -> Iterator[None]:
    """Partitioning is opt-in: these tests partition the test database's events table,
    and leave it plain again for the rest of the session."""
    if connection.vendor != "postgresql":
        yield
        return
    from jobs.event_layout import rebuild_event_table

    with django_db_blocker.unblock():
        rebuild_event_table(partitioned=True)
    yield
    with django_db_blocker.unblock():
        rebuild_event_table(partitioned=False)


@pytest.fixture(autouse=True)
def _drop_partitions_made_here() -> Iterator[None]:
    """Drop the event partitions a test made, so later reapers have no old periods to retire."""
    if connection.vendor != "postgresql":
        yield
        return
    from jobs.partitions import event_partitions

    before = {p.name for p in event_partitions()}
    yield
    with connection.cursor() as cursor:
        for part in event_partitions():
            if part.name not in before:
                cursor.execute(f'DROP TABLE "{part.name}"')
