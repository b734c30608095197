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
from tests.factories import HOSTILE_SCRIPT, make_user, queued, running, tick

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


# --- how the relay wakes up, and events that commit late ------------------------------


def _postgres() -> bool:
    return connections["default"].vendor == "postgresql"


async def test_on_postgresql_the_relay_reads_on_notify_not_by_polling(sockets, monkeypatch):
    """With the safety poll an hour away, only the trigger's NOTIFY can bring the event."""
    if not _postgres():
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's")
    monkeypatch.setenv("DASHBOARD_RELAY_SAFETY_POLL_SECONDS", "3600")
    monkeypatch.setenv("DASHBOARD_RELAY_DEBOUNCE_SECONDS", "0.02")
    viewer = await db(make_user)("viewer")
    job, held = await db(running)()
    comm, _, _ = await sockets(viewer, {"page": "job", "job": str(job.pk), "after": 2})
    assert relay.listening
    await asyncio.sleep(0.3)
    idle_ticks = relay.ticks
    await asyncio.sleep(1.0)
    assert relay.ticks - idle_ticks <= 1  # no 0.05 s polling while nothing happens
    heard = relay.notifications
    await db(tick)(job, held, 1, 2, "notified")
    await receive_until(comm, html_with("notified"))
    assert relay.notifications > heard


async def test_on_sqlite_the_relay_polls(sockets):
    if _postgres():
        pytest.skip("SQLite has no NOTIFY")
    viewer = await db(make_user)("viewer")
    job, held = await db(running)()
    comm, _, _ = await sockets(viewer, {"page": "job", "job": str(job.pk), "after": 2})
    assert not relay.listening
    await db(tick)(job, held, 1, 2, "polled")
    await receive_until(comm, html_with("polled"))
    assert relay.notifications == 0


def _event_ids(job) -> list[int]:
    from jobs.models import JobEvent

    return list(JobEvent.objects.filter(job=job).order_by("seq").values_list("id", flat=True))


async def test_an_event_that_commits_after_later_ids_is_still_reported() -> None:
    """Simulated on both databases: an id the relay skipped over (not visible yet) is
    reported when it appears, once, and never again."""
    from dashboard.relay import Relay
    from jobs.models import JobEvent

    def scenario() -> None:
        fresh_relay = Relay()
        early, held_early = running()
        late, held_late = running()
        fresh_relay._read_changes()  # the cursor is past everything so far
        tick(early, held_early, 1, 2, "early")
        tick(late, held_late, 1, 2, "late")
        skipped = JobEvent.objects.get(job=early, seq=3)
        values = {f.attname: getattr(skipped, f.attname) for f in JobEvent._meta.concrete_fields}
        skipped.delete()  # "not committed yet"
        first = fresh_relay._read_changes()
        assert set(first.jobs) == {late.pk}
        assert [(h.low, h.high) for h in fresh_relay.cursor.holes] == [(values["id"], values["id"])]
        JobEvent.objects.create(**values)  # "the transaction commits"
        second = fresh_relay._read_changes()
        assert second.jobs == {early.pk: 3}
        assert fresh_relay.cursor.holes == []
        assert fresh_relay._read_changes().jobs == {}  # reported once

    await db(scenario)()
    await db(connections.close_all)()  # or the test database could not be dropped


async def test_a_real_late_commit_on_postgresql_is_reported() -> None:
    """Two connections: an event inserted first but committed last is not lost."""
    if not _postgres():
        pytest.skip("SQLite serialises writers: no later id can commit first")
    import threading

    from django.db import transaction

    from dashboard.relay import Relay

    def scenario() -> None:
        fresh_relay = Relay()
        early, held_early = running()
        late, held_late = running()
        fresh_relay._read_changes()
        inserted, commit = threading.Event(), threading.Event()

        def slow_transaction() -> None:
            try:
                with transaction.atomic():
                    tick(early, held_early, 1, 2, "early")
                    inserted.set()
                    assert commit.wait(10)
            finally:
                connections.close_all()

        thread = threading.Thread(target=slow_transaction)
        thread.start()
        assert inserted.wait(10)
        for step in range(250):  # more later ids than any fixed re-read window would cover
            tick(late, held_late, step, 250, "late")  # higher ids, committed first
        assert set(fresh_relay._read_changes().jobs) == {late.pk}
        commit.set()
        thread.join(10)
        assert fresh_relay._read_changes().jobs == {early.pk: 3}

    await db(scenario)()
    await db(connections.close_all)()  # or the test database could not be dropped


async def test_new_jobs_are_reported_once_though_their_enqueue_event_is_not_stored() -> None:
    """Enqueue writes no event row (jobs.timeline): the relay finds new jobs by creation
    time, reports each once, and not the jobs that were there before it started."""
    from dashboard.relay import Relay

    def scenario() -> None:
        before = queued()
        fresh_relay = Relay()
        fresh_relay._read_changes()  # primed: `before` is the page's own
        first, second = queued(), queued()
        changes = fresh_relay._read_changes()
        assert set(changes.enqueued) == {first.pk, second.pk}
        assert before.pk not in changes.jobs and changes.jobs[first.pk] == 1
        assert fresh_relay._read_changes().enqueued == []
        # Not read while no list or summary page is open: started again from then.
        assert fresh_relay._read_changes(new_jobs=False).enqueued == []
        queued()
        assert fresh_relay._read_changes().enqueued == []

    await db(scenario)()
    await db(connections.close_all)()


async def test_a_flood_of_new_jobs_reports_the_newest(
    monkeypatch,
) -> None:
    import dashboard.cursor
    from dashboard.relay import Relay

    monkeypatch.setattr(dashboard.cursor, "BATCH", 3)

    def scenario() -> None:
        fresh_relay = Relay()
        fresh_relay._read_changes()
        jobs = [queued() for _ in range(5)]
        changes = fresh_relay._read_changes()
        assert changes.enqueued == [j.pk for j in reversed(jobs[-3:])]  # the newest, first
        assert not changes.full  # reading again soon would not reach the older ones

    await db(scenario)()
    await db(connections.close_all)()


async def test_a_job_enqueued_in_a_late_commit_is_reported_on_postgresql() -> None:
    """A job created first but committed after later jobs were read is still reported."""
    if not _postgres():
        pytest.skip("SQLite serialises writers: no later job can commit first")
    import threading

    from django.db import transaction

    from dashboard.relay import Relay

    def scenario() -> None:
        fresh_relay = Relay()
        fresh_relay._read_changes()
        inserted, commit = threading.Event(), threading.Event()
        early: list = []

        def slow_transaction() -> None:
            try:
                with transaction.atomic():
                    early.append(queued())
                    inserted.set()
                    assert commit.wait(10)
            finally:
                connections.close_all()

        thread = threading.Thread(target=slow_transaction)
        thread.start()
        assert inserted.wait(10)
        late = queued()
        assert fresh_relay._read_changes().enqueued == [late.pk]
        commit.set()
        thread.join(10)
        assert fresh_relay._read_changes().enqueued == [early[0].pk]

    await db(scenario)()
    await db(connections.close_all)()
