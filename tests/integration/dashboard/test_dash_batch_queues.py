"""Batch queues on the queues page: their messages waiting, in flight and dead, not job zeros."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from dashboard import render
from jobs.batches import claim_messages, dispatch_batches
from jobs.models import BatchMessage
from tests.factories import context, queued, running

pytestmark = pytest.mark.django_db


def fan_out(n: int):
    """A running ``fanout`` coordinator that dispatched ``n`` messages to ``<queue>.batch``."""
    parent, held = running("fanout", {"batches": n})
    payloads = [{"index": i} for i in range(n)]
    assert dispatch_batches(context(held), operation="fanout.batch", payloads=payloads) == n
    return parent


def messages_in_every_state(monkeypatch) -> tuple[str, str]:
    """Five messages: two waiting, two in flight, one dead. Returns (batch queue, job queue)."""
    monkeypatch.setenv("CONTROLPLANE_BATCH_MAX_ATTEMPTS", "1")
    parent = fan_out(5)
    batch_queue = f"{parent.queue}.batch"
    held = claim_messages(queue=batch_queue, limit=3, visibility_seconds=300)
    assert len(held) == 3
    # The consumer of the first one died on its only delivery and its visibility ran out.
    BatchMessage.objects.filter(pk=held[0].id).update(
        visible_after=timezone.now() - timedelta(seconds=1)
    )
    return batch_queue, parent.queue


def row_of(response, name: str):
    (row,) = [q for q in response.context["queues"] if q.name == name]
    return row


def cells(html: str, name: str) -> str:
    start = html.index(f'data-queue="{name}"')
    return html[start : html.index("</tr>", start)]


def test_a_batch_queue_shows_its_messages_by_state(viewer_client: Client, monkeypatch) -> None:
    batch_queue, job_queue = messages_in_every_state(monkeypatch)
    response = viewer_client.get("/dashboard/queues/")
    row = row_of(response, batch_queue)
    assert row.kind == "batch"
    counts = {state: (c.value, c.capped) for state, c in row.messages.items()}
    assert counts == {"waiting": (2, False), "in_flight": (2, False), "dead": (1, False)}
    html = cells(response.content.decode(), batch_queue)
    for state, n in (("waiting", 2), ("in_flight", 2), ("dead", 1)):
        cell = html[html.index(f'data-messages="{state}"') :]
        assert f'<span class="count">{n}</span>' in cell[: cell.index("</td>")]
    # Job queues keep their counts by state; the coordinator is running there.
    jobs = row_of(response, job_queue)
    assert jobs.messages is None and jobs.counts["running"].value == 1
    assert "data-messages" not in cells(response.content.decode(), job_queue)


def test_an_empty_batch_queue_shows_zero_messages(viewer_client: Client) -> None:
    parent = fan_out(1)
    write_queue = f"{parent.queue}.write"  # created beside the batch queue, still empty
    row = row_of(viewer_client.get("/dashboard/queues/"), write_queue)
    assert {s: c.value for s, c in row.messages.items()} == {
        "waiting": 0,
        "in_flight": 0,
        "dead": 0,
    }
    assert not row.active


def test_message_counts_stop_at_the_cap(viewer_client: Client, monkeypatch) -> None:
    monkeypatch.setenv("CONTROLPLANE_COUNT_CAP", "3")
    parent = fan_out(8)
    batch_queue = f"{parent.queue}.batch"
    claim_messages(queue=batch_queue, limit=4, visibility_seconds=300)
    row = row_of(viewer_client.get("/dashboard/queues/"), batch_queue)
    assert (row.messages["in_flight"].value, row.messages["in_flight"].capped) == (3, True)
    assert (row.messages["waiting"].value, row.messages["waiting"].capped) == (3, True)
    assert str(row.messages["waiting"]) == "3+"


def test_the_live_fragment_carries_the_message_counts(monkeypatch) -> None:
    batch_queue, _ = messages_in_every_state(monkeypatch)
    queued()  # a job queue beside it
    html = render.page_live("queues", "viewer")
    row = cells(html, batch_queue)
    assert row.count("data-messages") == 3
    dead = row[row.index('data-messages="dead"') :]
    assert '<span class="count">1</span>' in dead[: dead.index("</td>")]
