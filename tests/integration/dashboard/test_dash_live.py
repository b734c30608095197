"""The dashboard's WebSocket consumer and the per-process relay, with Channels' communicator."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import pytest_asyncio
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser
from django.db import connections

from dashboard.consumers import DashboardConsumer
from dashboard.relay import relay
from jobs.transitions import cancel_job
from tests.integration.dashboard.helpers import HOSTILE_SCRIPT, make_user, queued, running, tick

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

db = database_sync_to_async


@pytest.fixture(autouse=True)
def fast_relay(monkeypatch):
    monkeypatch.setenv("DASHBOARD_RELAY_INTERVAL_SECONDS", "0.05")
    monkeypatch.setenv("DASHBOARD_SUMMARY_REFRESH_SECONDS", "0.1")
    monkeypatch.setenv("DASHBOARD_WORKERS_REFRESH_SECONDS", "0.3")
    yield


@pytest_asyncio.fixture
async def sockets():
    """Open communicators; every one is disconnected at the end, and the relay must stop."""
    opened: list[WebsocketCommunicator] = []

    async def open_socket(user: Any, subscribe: dict[str, Any] | None = None):
        comm = WebsocketCommunicator(DashboardConsumer.as_asgi(), "/ws/dashboard/")
        comm.scope["user"] = user
        connected, code = await comm.connect(timeout=5)
        opened.append(comm)
        if connected and subscribe is not None:
            await comm.send_json_to({"subscribe": subscribe})
            await receive_until(comm, lambda m: m.get("subscribed") == subscribe["page"])
        return comm, connected, code

    yield open_socket
    for comm in opened:
        await comm.disconnect()
    await asyncio.sleep(0)
    assert not relay.subscribers and not relay.running
    # The database thread's connection would keep the test database from being dropped.
    await db(connections.close_all)()


async def receive_until(
    comm: WebsocketCommunicator, predicate: Callable[[dict], bool], timeout: float = 5.0
) -> dict:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        left = deadline - loop.time()
        if left <= 0:
            raise AssertionError("Timed out waiting for a WebSocket message.")
        message = await comm.receive_json_from(timeout=left)
        if predicate(message):
            return message


def html_with(text: str) -> Callable[[dict], bool]:
    return lambda m: text in m.get("html", "")


async def test_anonymous_and_roleless_users_are_refused(sockets) -> None:
    _, connected, code = await sockets(AnonymousUser())
    assert not connected and code == 4403
    nobody = await db(make_user)("nobody")
    _, connected, code = await sockets(nobody)
    assert not connected and code == 4403


async def test_a_job_page_receives_new_events_once_and_in_order(sockets) -> None:
    viewer = await db(make_user)("viewer")
    job, held = await db(running)()
    comm, connected, _ = await sockets(viewer, {"page": "job", "job": str(job.pk), "after": 2})
    assert connected
    await db(tick)(job, held, 1, 3, "first tick")
    message = await receive_until(comm, html_with("first tick"))
    html = message["html"]
    assert 'hx-swap-oob="beforeend:#timeline"' in html and 'data-seq="3"' in html
    assert 'data-seq="2"' not in html  # the page already had it
    assert "1 / 3" in html and ">Cancel</button>" not in html  # a viewer gets no buttons
    await db(tick)(job, held, 2, 3, "second tick")
    await db(tick)(job, held, 3, 3, "third tick")
    seen = ""
    while "third tick" not in seen:
        seen += (await receive_until(comm, lambda m: "html" in m))["html"]
    assert seen.index("second tick") < seen.index("third tick")
    assert "first tick" not in seen


async def test_a_job_page_catches_up_on_subscribe(sockets) -> None:
    operator = await db(make_user)("operator")
    job, held = await db(running)()
    await db(tick)(job, held, 1, 2, "before the socket")
    comm, _, _ = await sockets(operator)
    await comm.send_json_to({"subscribe": {"page": "job", "job": str(job.pk), "after": 1}})
    message = await receive_until(comm, html_with("before the socket"))
    assert 'data-seq="2"' in message["html"] and ">Cancel</button>" in message["html"]


async def test_state_changes_reach_the_job_page(sockets) -> None:
    operator = await db(make_user)("operator")
    job = await db(queued)()
    comm, _, _ = await sockets(operator, {"page": "job", "job": str(job.pk), "after": 1})
    await db(cancel_job)(job.pk, by="alice", reason="no longer needed")
    message = await receive_until(comm, html_with("job.cancelled"))
    assert "state-cancelled" in message["html"] and "alice" in message["html"]
    assert ">Retry</button>" in message["html"]


async def test_pushed_job_data_is_escaped(sockets) -> None:
    viewer = await db(make_user)("viewer")
    job, held = await db(running)()
    comm, _, _ = await sockets(viewer, {"page": "job", "job": str(job.pk), "after": 2})
    await db(tick)(job, held, 1, 2, HOSTILE_SCRIPT)
    message = await receive_until(comm, html_with("pwned"))
    assert "<script>" not in message["html"] and "&lt;script&gt;" in message["html"]


async def test_the_job_list_gets_changed_rows_and_a_new_jobs_notice(sockets) -> None:
    operator = await db(make_user)("operator")
    shown = await db(queued)(queue="listed")
    newest = shown.created_at.isoformat()
    comm, _, _ = await sockets(
        operator,
        {
            "page": "jobs",
            "ids": [str(shown.pk)],
            "query": "queue=listed",
            "newest": newest,
            "first_page": True,
        },
    )
    await db(cancel_job)(shown.pk)
    message = await receive_until(comm, html_with(f'id="job-{shown.pk}"'))
    assert "state-cancelled" in message["html"] and 'name="ids"' in message["html"]
    await db(queued)(queue="elsewhere")  # does not match the page's filter
    await db(queued)(queue="listed")
    message = await receive_until(comm, html_with("new-banner"))
    assert "1 new job matches" in message["html"]


async def test_summary_pages_are_refreshed(sockets) -> None:
    viewer = await db(make_user)("viewer")
    for page in ("overview", "workers", "queues"):
        comm, _, _ = await sockets(viewer, {"page": page})
        message = await receive_until(comm, html_with('id="page-body"'))
        assert 'hx-swap-oob="true"' in message["html"]


async def test_one_relay_task_however_many_sockets(sockets) -> None:
    viewer = await db(make_user)("viewer")
    job = await db(queued)()
    starts = relay.starts
    comms = []
    for i in range(40):
        page = {"page": "job", "job": str(job.pk), "after": 1} if i % 2 else {"page": "overview"}
        comm, _, _ = await sockets(viewer, page)
        comms.append(comm)
    tasks = [t for t in asyncio.all_tasks() if t.get_name() == "dashboard-relay" and not t.done()]
    assert len(tasks) == 1 and relay.starts == starts + 1
    ticks = relay.ticks
    await asyncio.sleep(0.5)
    assert relay.ticks - ticks <= 12  # one read every 0.05 s, not one per socket
    for comm in comms:
        await comm.disconnect()
    await asyncio.sleep(0.05)
    assert not relay.running and not relay.subscribers


async def test_unknown_subscriptions_are_answered_with_an_error(sockets) -> None:
    viewer = await db(make_user)("viewer")
    comm, _, _ = await sockets(viewer)
    await comm.send_json_to({"subscribe": {"page": "secrets"}})
    assert "error" in await comm.receive_json_from(timeout=5)
    await comm.send_json_to({"subscribe": {"page": "job", "job": "not-a-uuid"}})
    assert "error" in await comm.receive_json_from(timeout=5)
    await comm.send_json_to({"hello": 1})
    assert "error" in await comm.receive_json_from(timeout=5)


async def test_the_job_list_catches_up_on_subscribe(sockets) -> None:
    from django.utils import timezone

    operator = await db(make_user)("operator")
    shown = await db(queued)(queue="drawn")
    rendered_at = timezone.now().isoformat()
    await db(cancel_job)(shown.pk)  # between the page's render and its subscription
    await db(queued)(queue="drawn")
    comm, _, _ = await sockets(operator)
    await comm.send_json_to(
        {
            "subscribe": {
                "page": "jobs",
                "ids": [str(shown.pk)],
                "query": "queue=drawn",
                "newest": shown.created_at.isoformat(),
                "first_page": True,
                "rendered_at": rendered_at,
            }
        }
    )
    message = await receive_until(comm, html_with(f'id="job-{shown.pk}"'))
    assert "state-cancelled" in message["html"] and "1 new job matches" in message["html"]
    assert (await comm.receive_json_from(timeout=5)) == {"subscribed": "jobs"}
