"""Property tests of the two filter parsers (no database): any text gets an answer, never a crash.

- ``jobs.selectors.read_job_filters`` (the dashboard's) never raises: what it cannot
  read is reported in ``errors`` and not applied, and what it keeps is text
  every database can hold, so the list, its count, its live partial and a
  bulk action can query with it on PostgreSQL and SQLite alike.
- ``jobs.selectors.job_filters_from_query`` (the REST API's, shared by its
  bulk actions) returns a ``JobFilters`` or raises ``InvalidFilter``, the
  documented validation error, for any query string or JSON object.

Runs are derandomized, so CI sees the same examples every time. Nothing here
touches the database (pytest-django would refuse it without the ``db`` mark).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import pytest
from django.http import QueryDict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dashboard.inputs import request_problems
from jobs.selectors import FILTER_KEYS as FIELDS
from jobs.selectors import (
    InvalidFilter,
    JobFilters,
    job_filters_from_query,
    parse_limit,
    read_job_filters,
)
from jobs.selectors import JobFilters as ApiFilters
from jobs.selectors.payload import InvalidJSON, parse_json_object
from jobs.storable import printable, text_problem

PROPERTY = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

HOSTILE = st.sampled_from(
    ["\x00", "\ud800", "\udfff", "%00", "%ED%A0%80", "%", "&", "=", ",", " ", "+", "\u2028"]
)


def _text(max_parts: int) -> st.SearchStrategy[str]:
    """Any code points, with NUL, lone surrogates and query-string syntax often."""
    return st.lists(st.one_of(st.characters(), HOSTILE), max_size=max_parts).map("".join)


TEXT = _text(20)


def _nested(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**80), max_value=2**80), st.floats(), TEXT
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)),
    max_leaves=12,
)
# Candidate values of one field: free text, the spellings each field expects
# (nearly right and wrong), and JSON text for the payload filter (with NaN,
# 1e400, escapes of NUL and surrogates, and nesting up to 3,000 levels).
VALUES = st.one_of(
    TEXT,
    st.sampled_from(
        [
            "queued",
            "failed",
            "bogus",
            "15m",
            "7d",
            "2025-01-31T14:00",
            "2025-02-30T14:00",
            "0001-01-01T00:00+05:00",
            "9999-12-31T23:59-05:00",
            "01234567-89ab-cdef-0123-456789abcdef",
            "none",
            '{"a": NaN}',
            '{"a": Infinity}',
            '{"a": 1e400}',
            '{"a": "\\u0000"}',
            '{"\\ud800": 1}',
            "[1]",
            "{}",
            '{"account": 42}',
        ]
    ),
    st.builds(_nested, st.integers(min_value=0, max_value=3000)),
    JSON_VALUES.map(lambda v: json.dumps({"k": v}, ensure_ascii=False)),
)
PAIRS = st.lists(st.tuples(st.sampled_from([*FIELDS, "ids", "other"]), VALUES), max_size=6)


def _query(pairs: list[tuple[str, str]]) -> QueryDict:
    """The pairs as a browser would send them (percent-encoded UTF-8), decoded by Django."""
    text = "&".join(f"{quote(k)}={quote(v, safe='', errors='surrogatepass')}" for k, v in pairs)
    return QueryDict(text)


def _storable(value: Any) -> bool:
    if isinstance(value, str):
        return text_problem(value) is None
    if isinstance(value, dict):
        return all(_storable(k) and _storable(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(_storable(v) for v in value)
    if isinstance(value, float):
        return value == value and value not in (float("inf"), float("-inf"))
    return True


# --- the dashboard's parser -------------------------------------------------------


def _check_dashboard(filters: JobFilters) -> None:
    """What every parse must give, whatever the input."""
    # Everything kept is storable; everything shown back is printable.
    for key, value in filters.params():
        assert text_problem(key) is None and text_problem(value) is None, (key, value)
    assert all(text_problem(v) is None for v in filters.raw.values())
    assert text_problem(filters.payload_text) is None
    assert all(text_problem(m) is None for m in filters.errors.values())
    assert set(filters.errors) <= set(FIELDS)
    # A field reported as unreadable restricts nothing (status keeps its valid values).
    blank = {
        "queue": filters.queue,
        "operation": filters.operation,
        "parent": filters.parent or filters.top_level,
        "range": filters.range,
        "from": filters.created_after,
        "created_after": filters.created_after,
        "to": filters.created_before,
        "created_before": filters.created_before,
        "q": filters.q,
        "payload": filters.payload,
    }
    for name in filters.errors:
        if name in blank:
            assert not blank[name], (name, blank[name])
    if filters.payload is not None:
        assert isinstance(filters.payload, dict) and filters.payload
        assert _storable(filters.payload)
    for stamp in (filters.created_after, filters.created_before):
        assert stamp is None or stamp.utcoffset() is not None
    # The URL it produces (links, pages, the bulk form) holds only what was applied,
    # and reads back to the same filters with nothing to report.
    again = read_job_filters(QueryDict(filters.querystring()))
    assert again.params() == filters.params() and again.errors == {}, (filters, again)
    assert (again.status, again.payload, again.created_after) == (
        filters.status,
        filters.payload,
        filters.created_after,
    )
    # Matching a job in Python (the live relay) cannot fail either.
    job = {
        "id": "01234567-89ab-cdef-0123-456789abcdef",
        "status": "queued",
        "queue": "default",
        "operation": "ping",
        "parent_id": None,
        "created_at": datetime(2025, 1, 1, tzinfo=UTC),
        "payload": {"a": 1, "account": 42},
        "error_code": "",
        "error_message": "",
    }
    assert filters.matches(job) in (True, False)


@PROPERTY
@given(text=_text(80))
def test_dashboard_any_query_text(text: str) -> None:
    """Raw query-string text, as a client may send it (including text Django never decodes to)."""
    _check_dashboard(read_job_filters(QueryDict(text)))


@PROPERTY
@given(pairs=PAIRS)
def test_dashboard_any_filter_values(pairs: list[tuple[str, str]]) -> None:
    _check_dashboard(read_job_filters(_query(pairs)))


@PROPERTY
@given(pairs=st.lists(st.tuples(st.sampled_from(FIELDS), VALUES), max_size=6))
def test_dashboard_values_straight_from_a_socket(pairs: list[tuple[str, str]]) -> None:
    """The WebSocket subscription hands the parser a str: lone surrogates arrive undecoded."""
    query = QueryDict(mutable=True)
    for key, value in pairs:
        query.appendlist(key, value)
    _check_dashboard(read_job_filters(query))


@PROPERTY
@given(text=VALUES)
def test_payload_filter_is_an_object_or_a_sentence(text: str) -> None:
    try:
        value = parse_json_object(text)
    except InvalidJSON as error:
        message = str(error)
        assert message.endswith(".") and text_problem(message) is None
    else:
        assert isinstance(value, dict) and value and _storable(value)


@PROPERTY
@given(pairs=st.lists(st.tuples(TEXT, TEXT), max_size=5))
def test_request_problems_name_exactly_the_unstorable_fields(
    pairs: list[tuple[str, str]],
) -> None:
    query = QueryDict(mutable=True)
    for key, value in pairs:
        query.appendlist(key, value)
    problems = request_problems(query)
    bad = {printable(k) for k, v in pairs if text_problem(k) or text_problem(v)}
    assert set(problems) == bad
    assert all(text_problem(k) is None and text_problem(m) is None for k, m in problems.items())


# --- the REST API's parser ------------------------------------------------------------

API_FIELDS = ["status", "queue", "operation", "parent", "created_after", "created_before", "q"]


def _check_api(data: Any, *, allow_ids: bool = False) -> None:
    try:
        filters = job_filters_from_query(data, allow_ids=allow_ids)
    except InvalidFilter as error:
        assert error.errors and all(isinstance(m, list) and m for m in error.errors.values())
        for messages in error.errors.values():
            assert all(isinstance(m, str) and text_problem(m) is None for m in messages)
    else:
        assert isinstance(filters, ApiFilters)
        for text in (*filters.queue, *filters.operation, filters.q):
            assert text_problem(text) is None
        assert all(
            s in ("queued", "running", "succeeded", "failed", "cancelled") for s in filters.status
        )  # noqa: E501


@PROPERTY
@given(text=_text(80))
def test_api_any_query_text(text: str) -> None:
    _check_api(QueryDict(text))


@PROPERTY
@given(
    pairs=st.lists(st.tuples(st.sampled_from([*API_FIELDS, "ids", "limit"]), VALUES), max_size=6)
)
def test_api_any_query_values(pairs: list[tuple[str, str]]) -> None:
    _check_api(_query(pairs))


@PROPERTY
@given(
    body=st.dictionaries(
        st.sampled_from([*API_FIELDS, "ids", "all", "reason"]),
        st.one_of(JSON_VALUES, VALUES, st.lists(VALUES, max_size=3)),
        max_size=6,
    )
)
def test_api_any_json_body(body: dict[str, Any]) -> None:
    """A bulk action's JSON body: values of any type, ``ids`` included."""
    _check_api(body, allow_ids=True)


@PROPERTY
@given(raw=st.one_of(st.none(), VALUES, JSON_VALUES))
def test_api_limit_is_in_range_or_refused(raw: Any) -> None:
    try:
        value = parse_limit(raw, default=50, maximum=500)
    except InvalidFilter as error:
        assert set(error.errors) == {"limit"}
    else:
        assert 1 <= value <= 500


@pytest.mark.parametrize(
    "text",
    ['{"a": NaN}', '{"a": -Infinity}', '{"a": 1e400}', '{"a": "\\u0000"}', '{"\\ud800": 1}'],
)
def test_payload_filter_refuses_what_no_database_stores(text: str) -> None:
    with pytest.raises(InvalidJSON):
        parse_json_object(text)


def test_payload_filter_refuses_nesting_deeper_than_recursion_allows() -> None:
    for depth in (33, 2_400, 100_000):
        with pytest.raises(InvalidJSON, match="levels deep"):
            parse_json_object(_nested(depth))
