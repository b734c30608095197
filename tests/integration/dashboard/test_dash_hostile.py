"""Hostile input on the dashboard: never a 500, nothing stored.

Each case here would be a 500 on at least one database without its guard: a NUL in a
filter (PostgreSQL refuses it in the driver), a payload filter holding NUL,
a lone surrogate, NaN, Infinity, ``1e400`` or 2,400 levels of nesting, a
date whose UTC equivalent overflows, a queue name or a reason with a NUL.

The dashboard's pattern for a filter it cannot read is the one a malformed
date or payload always had: the page is drawn, the field says what is
wrong, and the filter is not applied. An action (a POST) carrying such text
is refused with a 400 page, and a bulk action whose filter cannot be read
is refused too (applying the rest of the filter would widen it).
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any
from urllib.parse import quote

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connections
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dashboard.consumers import DashboardConsumer
from dashboard.relay import relay
from jobs.models import JobEvent, OperatorAction, Queue
from jobs.selectors.payload import MAX_JSON_DEPTH
from tests.factories import ECHO, failed, fresh, make_user, queued

pytestmark = pytest.mark.django_db

NUL = "\x00"
LONE = "\ud800"
LIST = "/dashboard/jobs/"
LIVE = "/dashboard/jobs/live/?newest=2000-01-01T00:00Z&ids="
COUNT = "/dashboard/jobs/count/"


def nested(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def _get(client: Client, url: str, query: str) -> Any:
    joiner = "&" if "?" in url else "?"
    return client.get(f"{url}{joiner}{query}")


def assert_clean(response: Any) -> str:
    """A drawn page (not a 5xx) whose HTML holds no NUL and no lone surrogate."""
    assert response.status_code == 200, response.status_code
    html = response.content.decode()  # a lone surrogate could not have been encoded
    assert NUL not in html
    return html


# --- filters on the job list, its live partial and its count ------------------------------


TEXT_CASES = [
    ("queue", "%00"),
    ("queue", "a%00b"),
    ("operation", "%00"),
    ("operation", "dash.echo%00"),
    ("q", "%00"),
    ("q", "a%00b"),
    ("parent", "%00"),
    ("from", "%00"),
    ("range", "%00"),
]


@pytest.mark.parametrize(("field", "value"), TEXT_CASES)
def test_a_nul_in_a_filter_is_reported_and_not_applied(
    operator_client: Client, field: str, value: str
) -> None:
    shown = queued(queue="hostile-q")
    page = operator_client.get(f"{LIST}?{field}={value}")
    html = assert_clean(page)
    assert field in page.context["filters"].errors
    assert "NUL character" in page.context["filters"].errors[field]
    assert "were not applied" in html and "NUL character" in html
    assert shown in page.context["jobs"]  # the filter restricted nothing
    assert_clean(_get(operator_client, LIVE, f"{field}={value}"))
    assert_clean(_get(operator_client, COUNT, f"{field}={value}"))


PAYLOAD_CASES = {
    "nul escape": '{"a": "\\u0000"}',
    "nul in a key": '{"\\u0000": 1}',
    "lone surrogate escape": '{"a": "\\ud800"}',
    "lone surrogate key": '{"\\udfff": 1}',
    "raw nul": '{"a": "x\x00"}',
    "nan": '{"a": NaN}',
    "infinity": '{"a": Infinity}',
    "minus infinity": '{"a": [-Infinity]}',
    "1e400": '{"a": 1e400}',
    "nested 2400": nested(2400),
    "nested 100000": nested(100_000),
    "just too deep": nested(MAX_JSON_DEPTH + 1),
    "thousands of digits": '{"a": ' + "9" * 5000 + "}",
}


@pytest.mark.parametrize("text", PAYLOAD_CASES.values(), ids=PAYLOAD_CASES.keys())
def test_a_hostile_payload_filter_is_reported_and_not_applied(
    operator_client: Client, text: str
) -> None:
    shown = queued(ECHO, {"a": 1})
    query = "payload=" + quote(text, safe="")
    page = _get(operator_client, LIST, query)
    html = assert_clean(page)
    filters = page.context["filters"]
    assert filters.payload is None and "payload" in filters.errors
    assert shown in page.context["jobs"]
    assert "field-error" in html and "payload=" not in page.context["query"]
    assert_clean(_get(operator_client, LIVE, query))
    assert_clean(_get(operator_client, COUNT, query))


def test_raw_surrogate_bytes_in_the_query_are_read_as_replacement_characters(
    operator_client: Client,
) -> None:
    """%ED%A0%80 is not UTF-8: Django decodes it to U+FFFD, a character like any other."""
    queued(ECHO, {"a": "x"})
    for query in ("payload=%7B%22a%22%3A%22%ED%A0%80%22%7D", "queue=%ED%A0%80", "q=%ED%A0%80"):
        page = _get(operator_client, LIST, query)
        assert_clean(page)
        assert page.context["jobs"] == []  # applied: nothing holds U+FFFD
        assert_clean(_get(operator_client, LIVE, query))


def test_the_deepest_payload_filter_allowed_still_matches(operator_client: Client) -> None:
    value: Any = 1
    for _ in range(MAX_JSON_DEPTH - 1):
        value = {"a": value}
    hit, miss = queued(ECHO, {"deep": value}), queued(ECHO, {"deep": 2})
    page = _get(operator_client, LIST, "payload=" + quote(json.dumps({"deep": value})))
    assert page.context["filters"].errors == {}
    assert page.context["jobs"] == [hit] and miss not in page.context["jobs"]


@pytest.mark.parametrize(
    "query",
    [
        "status=bogus",
        "status=%00",
        "range=forever",
        "from=0001-01-01T00:00%2B05:00",  # UTC is before year 1: overflowed on SQLite
        "to=9999-12-31T23:59-05:00",  # UTC is after year 9999
        "from=2024-13-45T00:00",
        "to=2024-02-30T00:00",
    ],
)
def test_other_unreadable_filters_are_reported_and_not_applied(
    operator_client: Client, query: str
) -> None:
    shown = queued()
    page = _get(operator_client, LIST, query)
    html = assert_clean(page)
    field = query.split("=")[0]
    assert field in page.context["filters"].errors and "field-error" in html
    assert shown in page.context["jobs"]
    assert_clean(_get(operator_client, LIVE, query))
    assert_clean(_get(operator_client, COUNT, query))


@pytest.mark.parametrize(
    "newest", ["2024-13-45T00:00", "0001-01-01T00:00%2B05:00", "%00", "9999-12-31T23:59-05:00"]
)
def test_an_unreadable_newest_time_on_the_live_partial_is_ignored(
    operator_client: Client, newest: str
) -> None:
    queued()
    response = operator_client.get(f"/dashboard/jobs/live/?ids=&newest={newest}")
    assert response.status_code == 200 and "new-banner" not in response.content.decode()


def test_job_pages_take_any_seq_and_refuse_what_is_not_a_job_id(operator_client: Client) -> None:
    job = queued()
    huge = "9" * 30
    for path in (
        f"/dashboard/jobs/{job.pk}/live/?after={huge}",
        f"/dashboard/jobs/{job.pk}/earlier/?before={huge}",
        f"/dashboard/jobs/{job.pk}/live/?after=%00",
    ):
        assert operator_client.get(path).status_code == 200, path
    for path in (
        "/dashboard/jobs/%00/",
        f"/dashboard/jobs/{job.pk}%00/",
        "/dashboard/jobs/%ED%A0%80/live/",
    ):
        assert operator_client.get(path).status_code == 404, path
    assert operator_client.post(f"/dashboard/jobs/{job.pk}%00/cancel/").status_code == 404
    assert fresh(job).status == "queued"


# --- actions: refused with a 400, nothing stored -------------------------------------------


def _stored() -> tuple[int, int, int]:
    return Queue.objects.count(), JobEvent.objects.count(), OperatorAction.objects.count()


def assert_refused(response: Any, *words: str) -> None:
    assert response.status_code == 400, response.status_code
    html = response.content.decode()
    assert NUL not in html and "Nothing was changed." in html
    for word in words:
        assert word in html


@pytest.mark.parametrize("path", ["/dashboard/queues/pause/", "/dashboard/queues/resume/"])
@pytest.mark.parametrize("name", ["a\x00b", NUL, " \x00 "])
def test_a_queue_name_that_cannot_be_stored_is_refused(
    operator_client: Client, path: str, name: str
) -> None:
    before = _stored()
    response = operator_client.post(path, {"name": name})
    assert_refused(response, "name")
    assert _stored() == before


def test_a_cap_for_a_queue_name_that_cannot_be_stored_is_refused(operator_client: Client) -> None:
    before = _stored()
    response = operator_client.post(
        "/dashboard/queues/cap/", {"name": "a\x00b", "concurrency_cap": "5"}
    )
    assert_refused(response)
    assert _stored() == before


def test_a_cancel_with_a_nul_in_its_reason_is_refused(operator_client: Client) -> None:
    job = queued()
    before = _stored()
    response = operator_client.post(f"/dashboard/jobs/{job.pk}/cancel/", {"reason": "a\x00b"})
    assert_refused(response, "reason", "NUL character")
    assert fresh(job).status == "queued" and _stored() == before
    done = operator_client.post(f"/dashboard/jobs/{job.pk}/cancel/", {"reason": "a b"})
    assert done.status_code == 302 and fresh(job).status == "cancelled"


def test_a_retry_with_a_nul_in_its_reason_is_refused(operator_client: Client) -> None:
    job = failed()
    before = _stored()
    response = operator_client.post(f"/dashboard/jobs/{job.pk}/retry/", {"reason": "x\x00"})
    assert_refused(response, "reason", "NUL character")
    assert fresh(job).status == "failed" and _stored() == before


def test_a_nul_in_the_next_address_is_refused(operator_client: Client) -> None:
    job = queued()
    response = operator_client.post(f"/dashboard/jobs/{job.pk}/cancel/", {"next": "/dash\x00"})
    assert_refused(response)
    assert fresh(job).status == "queued"


@pytest.mark.parametrize(
    "query",
    [
        "queue=a%00b",
        "operation=%00",
        "q=a%00b",
        "payload=" + quote('{"a": "\\u0000"}'),
        "payload=" + quote('{"a": NaN}'),
        "payload=" + quote('{"a": 1e400}'),
        "payload=" + quote(nested(2400)),
        "status=bogus",
        "from=0001-01-01T00:00%2B05:00",
    ],
)
@pytest.mark.parametrize("confirm", ["", "1"])
def test_a_bulk_cancel_by_an_unreadable_filter_is_refused(
    operator_client: Client, query: str, confirm: str
) -> None:
    jobs = [queued(queue="bulk-hostile") for _ in range(3)]
    before = _stored()
    response = operator_client.post(
        f"/dashboard/jobs/bulk/?{query}", {"do": "cancel-filter", "confirm": confirm}
    )
    assert_refused(response)
    assert all(fresh(j).status == "queued" for j in jobs) and _stored() == before


def test_a_bulk_cancel_with_a_nul_in_its_reason_or_ids_is_refused(operator_client: Client) -> None:
    job = queued(queue="bulk-reason")
    before = _stored()
    for data in (
        {"do": "cancel-filter", "confirm": "1", "reason": "a\x00b"},
        {"do": "cancel-selected", "confirm": "1", "ids": [f"{job.pk}\x00"]},
    ):
        assert_refused(operator_client.post("/dashboard/jobs/bulk/?queue=bulk-reason", data))
    assert fresh(job).status == "queued" and _stored() == before


def test_raw_surrogate_bytes_in_a_form_are_read_as_replacement_characters(
    operator_client: Client,
) -> None:
    job = queued()
    response = operator_client.post(
        f"/dashboard/jobs/{job.pk}/cancel/",
        "reason=%ED%A0%80",
        content_type="application/x-www-form-urlencoded",
    )
    assert response.status_code == 302 and fresh(job).status == "cancelled"
    event = JobEvent.objects.get(job=job, event="job.cancelled")
    assert set(event.fields["reason"]) == {"\ufffd"}


# --- the WebSocket subscription reads the same filters ------------------------------------


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_hostile_subscription_is_answered_not_crashed() -> None:
    """The list page's subscription carries its filter and times; a bad one must not kill it.

    A socket's JSON can hold what no form can: lone surrogates (``"\\ud800"``),
    NaN and Infinity, numbers of any size, values of any type.
    """
    user = await database_sync_to_async(make_user)("operator")
    job = await database_sync_to_async(queued)()
    comm = WebsocketCommunicator(DashboardConsumer.as_asgi(), "/ws/dashboard/")
    comm.scope["user"] = user
    try:
        connected, _ = await comm.connect(timeout=5)
        assert connected
        for spec in (
            {
                "page": "jobs",
                "ids": [str(job.pk), "nope", 7, None, {"a": 1}],
                "query": f'queue={NUL}&q={LONE}&payload={{"a":"\\ud800"}}&from=2024-13-45T00:00',
                "first_page": True,
                "newest": "2024-13-45T00:00",
                "rendered_at": "0001-01-01T00:00+05:00",
            },
            {"page": "jobs", "ids": [], "query": ["not", "text"], "rendered_at": LONE},
        ):
            await comm.send_json_to({"subscribe": spec})
            assert await comm.receive_json_from(timeout=5) == {"subscribed": "jobs"}
        for after in ("Infinity", "NaN", "1e400", '"x"', "99999999999999999999"):
            text = f'{{"subscribe": {{"page": "job", "job": "{job.pk}", "after": {after}}}}}'
            await comm.send_to(text_data=text)
            answer = await comm.receive_json_from(timeout=5)
            assert answer.get("subscribed") == "job" or "error" in answer, answer
    finally:
        await comm.disconnect()
        await asyncio.sleep(0)
        assert not relay.subscribers
        await database_sync_to_async(connections.close_all)()


# --- property: no query string makes the job list fail -------------------------------------

_FILTER_NAMES = ["status", "queue", "operation", "parent", "range", "from", "to", "q", "payload"]
_STAMPS = st.sampled_from(
    ["0001-01-01T00:00+05:00", "9999-12-31T23:59-05:00", "2024-13-45T00:00", "2025-01-01T00:00"]
)
_HOSTILE_TEXT = st.one_of(
    st.text(max_size=30),
    st.sampled_from(
        [NUL, LONE, "%00", "%ED%A0%80", "NaN", "1e400", '{"a":NaN}', '{"a":"\\u0000"}', "queued"]
    ),
    _STAMPS,
    st.builds(nested, st.integers(min_value=0, max_value=3000)),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
        ),
        max_leaves=8,
    ).map(lambda v: json.dumps({"k": v})),
)
# Page cursors are base64 of "created_at|id": forge them with hostile times and ids.
_CURSORS = st.builds(
    lambda stamp, ident: base64.urlsafe_b64encode(
        f"{stamp}|{ident}".encode(errors="surrogatepass")
    ).decode(),
    st.one_of(_STAMPS, st.text(max_size=10)),
    st.one_of(st.uuids().map(str), st.text(max_size=10)),
) | st.text(max_size=20)
_PARAMS = st.fixed_dictionaries(
    {},
    optional={
        **dict.fromkeys(_FILTER_NAMES, _HOSTILE_TEXT),
        "after": _CURSORS,
        "before": _CURSORS,
        "newest": _HOSTILE_TEXT,
    },
)


@settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(params=_PARAMS)
def test_no_query_string_makes_the_job_list_fail(
    operator_client: Client, params: dict[str, str]
) -> None:
    """Any filters, cursors and times, encoded as a browser would: a drawn page, never a 5xx."""
    query = "&".join(f"{k}={quote(v, safe='', errors='surrogatepass')}" for k, v in params.items())
    for url in (LIST, LIVE, COUNT):
        response = _get(operator_client, url, query)
        assert response.status_code == 200, (url, query, response.status_code)
