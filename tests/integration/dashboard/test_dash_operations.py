"""The operations page: the list, and the operators' enqueue form built from each schema.

Two test operations are registered in this process (nothing runs them):
``dashop.flat`` has a flat schema (one property of each type the form
draws as an input), ``dashop.nested`` an object inside its payload, so its
form is a JSON textarea.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from django_controlplane.remote import register_worker
from django_controlplane.testing import assert_enqueued, refute_enqueued
from jobs import audit
from jobs.models import OperatorAction
from jobs.operations import operation, registry
from tests.factories import HOSTILE_SCRIPT, make_user
from tests.integration.timelines import events_of

pytestmark = pytest.mark.django_db

PAGE = "/dashboard/operations/"
ENQUEUE = "/dashboard/operations/enqueue/"
FLAT = "dashop.flat"
NESTED = "dashop.nested"
NUL = "\x00"

FLAT_SCHEMA = {
    "type": "object",
    "required": ["title", "count"],
    "properties": {
        "title": {"type": "string", "description": "Shown to people"},
        "count": {"type": "integer", "minimum": 1, "maximum": 50},
        "ratio": {"type": "number"},
        "urgent": {"type": "boolean"},
        "size": {"enum": ["small", "large", 3]},
    },
    "additionalProperties": False,
}
NESTED_SCHEMA = {
    "type": "object",
    "required": ["target"],
    "properties": {"target": {"type": "object", "required": ["id"]}},
}

if FLAT not in registry:

    @operation(FLAT, queue="dashop", max_attempts=2, payload_schema=FLAT_SCHEMA)
    def flat(ctx: Any, payload: dict[str, Any]) -> None:
        """A form with one input per property."""

    @operation(NESTED, payload_schema=NESTED_SCHEMA)
    def nested(ctx: Any, payload: dict[str, Any]) -> None:
        """A form with a JSON textarea."""


def form_of(response, name: str):
    """The enqueue form the page drew for operation ``name``."""
    [row] = [r for r in response.context["rows"] if r["info"].name == name]
    return row["form"]


def field(form, key: str):
    [made] = [i for i in form.inputs if i.key == key]
    return made


def flat_post(**changes: str) -> dict[str, str]:
    """A valid submission of ``dashop.flat``; inputs are p0 (title) ... p4 (size)."""
    data = {"operation": FLAT, "queue": "", "priority": "0", "run_after": ""}
    data |= {"p0": "Quarterly report", "p1": "7", "p2": "0.25", "p3": "true", "p4": "1"}
    return data | changes


def username(client: Client) -> str:
    return User.objects.get(pk=client.session["_auth_user_id"]).get_username()


def assert_refused(response) -> str:
    """A 400 page (never a 5xx) whose HTML can be encoded and holds no NUL; nothing stored."""
    assert response.status_code == 400, response.status_code
    html = response.content.decode()
    assert NUL not in html
    refute_enqueued()
    assert not OperatorAction.objects.exists()
    return html


# --- the list ---------------------------------------------------------------------------


def test_the_page_lists_local_and_remote_operations_and_viewers_get_no_form(
    viewer_client: Client,
) -> None:
    declared = {"name": "dashop.remote", "queue": "gpu", "payload_schema": NESTED_SCHEMA}
    register_worker(user=make_user("viewer"), operations=[declared])
    response = viewer_client.get(PAGE)
    assert response.status_code == 200
    html = response.content.decode()
    for name in ("ping", FLAT, NESTED, "dashop.remote"):
        assert f'data-operation="{name}"' in html
    remote = [r["info"] for r in response.context["rows"] if r["info"].name == "dashop.remote"]
    assert remote[0].kind == "remote" and remote[0].online and remote[0].queue == "gpu"
    assert f'href="{PAGE}" aria-current="page"' in html  # the nav link
    assert all(r["form"] is None for r in response.context["rows"])
    assert 'name="operation"' not in html and ENQUEUE not in html


def test_operators_get_typed_inputs_for_a_flat_schema_and_json_otherwise(
    operator_client: Client,
) -> None:
    response = operator_client.get(PAGE)
    flat_form, nested_form = form_of(response, FLAT), form_of(response, NESTED)
    kinds = {i.key: (i.kind, i.required) for i in flat_form.inputs}
    assert kinds == {
        "title": ("string", True),
        "count": ("integer", True),
        "ratio": ("number", False),
        "urgent": ("boolean", False),
        "size": ("enum", False),
    }
    assert nested_form.inputs is None and nested_form.payload == "{}"
    assert form_of(response, "ping").inputs == []  # no properties allowed: nothing to fill
    html = response.content.decode()
    assert 'type="number" name="p1" value="" step="1" min="1" max="50"' in html
    assert '<abbr title="required">*</abbr>' in html
    assert '<textarea name="payload"' in html and ">{}</textarea>" in html


def test_a_remote_operation_name_is_escaped(operator_client: Client) -> None:
    register_worker(user=make_user("viewer"), operations=[{"name": HOSTILE_SCRIPT, "queue": "q"}])
    html = operator_client.get(PAGE).content.decode()
    assert HOSTILE_SCRIPT not in html and "&lt;script&gt;" in html


# --- enqueueing -------------------------------------------------------------------------


def test_an_operator_enqueues_from_the_typed_form(operator_client: Client) -> None:
    data = flat_post(priority="5", run_after="2031-02-03T04:05")
    response = operator_client.post(ENQUEUE, data)
    [job] = assert_enqueued(FLAT, queue="dashop", count=1)
    assert response.status_code == 302 and response["Location"] == f"/dashboard/jobs/{job.pk}/"
    assert job.payload == {
        "title": "Quarterly report",
        "count": 7,
        "ratio": 0.25,
        "urgent": True,
        "size": "large",
    }
    assert (job.queue, job.priority, job.max_attempts) == ("dashop", 5, 2)
    assert job.run_after == datetime(2031, 2, 3, 4, 5, tzinfo=UTC)
    assert events_of(job) == ["job.enqueued"]
    action = OperatorAction.objects.get()
    assert (action.action, action.target, action.count) == (audit.ENQUEUE, str(job.pk), 1)
    assert action.username == username(operator_client)
    assert action.filter == {"operation": FLAT, "queue": "dashop"}
    page = operator_client.get(response["Location"])
    assert page.status_code == 200


def test_empty_optional_inputs_are_left_out_and_an_enum_keeps_its_type(
    operator_client: Client,
) -> None:
    operator_client.post(ENQUEUE, flat_post(p2="", p3="", p4="2", queue="  other  "))
    [job] = assert_enqueued(FLAT, queue="other", count=1)
    assert job.payload == {"title": "Quarterly report", "count": 7, "size": 3}


def test_an_operator_enqueues_json_for_a_nested_schema(operator_client: Client) -> None:
    payload = '{"target": {"id": 42, "tags": ["a", "b"]}}'
    response = operator_client.post(ENQUEUE, {"operation": NESTED, "payload": payload})
    [job] = assert_enqueued(NESTED, payload={"target": {"id": 42}}, count=1)
    assert response["Location"] == f"/dashboard/jobs/{job.pk}/"
    assert job.payload == {"target": {"id": 42, "tags": ["a", "b"]}}
    assert OperatorAction.objects.get().target == str(job.pk)


def test_an_invalid_payload_is_shown_beside_its_input_and_nothing_is_stored(
    operator_client: Client,
) -> None:
    response = operator_client.post(ENQUEUE, flat_post(p1="99", p0=""))
    html = assert_refused(response)
    form = form_of(response, FLAT)
    assert form.bound and form.has_errors
    assert field(form, "count").value == "99"
    assert any("greater than the maximum of 50" in e for e in field(form, "count").errors)
    assert any("required" in e for e in field(form, "title").errors)
    assert "greater than the maximum of 50" in html and 'value="99"' in html
    assert '<details class="operation-enqueue" open>' in html
    # A value that could not be read is named, and the others still get their schema errors.
    refused = form_of(operator_client.post(ENQUEUE, flat_post(p1="99", p3="maybe")), FLAT)
    assert field(refused, "urgent").errors == ["Choose true or false."]
    assert any("maximum of 50" in e for e in field(refused, "count").errors)
    # The other operations' forms are drawn blank.
    assert not form_of(response, NESTED).bound


def test_a_schema_error_in_json_is_shown_under_the_textarea(operator_client: Client) -> None:
    response = operator_client.post(ENQUEUE, {"operation": NESTED, "payload": '{"target": {}}'})
    assert_refused(response)
    form = form_of(response, NESTED)
    assert any("'id' is a required property" in e for e in form.errors["payload"])
    assert form.payload == '{"target": {}}'


def test_unknown_or_hidden_operations_are_refused(operator_client: Client) -> None:
    html = assert_refused(operator_client.post(ENQUEUE, {"operation": "no.such.op"}))
    assert "Unknown operation" in html


def test_enqueueing_needs_an_operator_post_and_a_csrf_token(viewer_client: Client) -> None:
    assert viewer_client.post(ENQUEUE, flat_post()).status_code == 403
    operator = Client(enforce_csrf_checks=True)
    operator.force_login(make_user("operator"))
    assert operator.get(ENQUEUE).status_code == 405
    assert operator.post(ENQUEUE, flat_post()).status_code == 403
    refute_enqueued()
    assert not OperatorAction.objects.exists()
    token = operator.get(PAGE).context["csrf_token"]
    accepted = operator.post(ENQUEUE, flat_post(csrfmiddlewaretoken=str(token)))
    assert accepted.status_code == 302
    [job] = assert_enqueued(count=1)
    assert job.operation == FLAT


# --- hostile input: an inline error, never a 500, nothing stored -----------------------

HOSTILE_FLAT = [
    ("title", {"p0": f"a{NUL}b"}, "NUL"),
    ("count", {"p1": "9" * 30}, "whole number"),
    ("count", {"p1": "1e3"}, "whole number"),
    ("ratio", {"p2": "1e400"}, "finite number"),
    ("ratio", {"p2": "nan"}, "finite number"),
    ("ratio", {"p2": "9" * 5000}, "finite number"),
    ("urgent", {"p3": "yes"}, "true or false"),
    ("size", {"p4": "7"}, "listed values"),
    ("size", {"p4": "9" * 50}, "listed values"),
]


@pytest.mark.parametrize(("key", "change", "said"), HOSTILE_FLAT)
def test_hostile_typed_input_is_an_inline_error(
    operator_client: Client, key: str, change: dict[str, str], said: str
) -> None:
    response = operator_client.post(ENQUEUE, flat_post(**change))
    assert_refused(response)
    assert any(said in e for e in field(form_of(response, FLAT), key).errors)


HOSTILE_FIELDS = [
    ("queue", {"queue": f"q{NUL}"}, "NUL"),
    ("queue", {"queue": "q" * 201}, "at most 200"),
    ("priority", {"priority": "9" * 100}, "from -100 to 100"),
    ("priority", {"priority": "101"}, "from -100 to 100"),
    ("run_after", {"run_after": "2031-13-45T99:99"}, "date and time"),
    ("run_after", {"run_after": "0001-01-01T00:00+05:00"}, "date and time"),
    ("run_after", {"run_after": f"2031-01-01{NUL}"}, "date and time"),
]


@pytest.mark.parametrize(("where", "change", "said"), HOSTILE_FIELDS)
def test_hostile_queue_priority_or_time_is_an_inline_error(
    operator_client: Client, where: str, change: dict[str, str], said: str
) -> None:
    response = operator_client.post(ENQUEUE, flat_post(**change))
    assert_refused(response)
    assert any(said in e for e in form_of(response, FLAT).errors[where])


HOSTILE_JSON = [
    ('{"target": {"id": "\\u0000"}}', "NUL"),
    ('{"target": {"id": "\\ud800"}}', "surrogate"),
    (f'{{"target": {{"id": 1{NUL}}}}}', "NUL"),
    ('{"target": {"id": 1e400}}', "too large"),
    ('{"target": {"id": NaN}}', "finite number"),
    ('{"target": {"id": ' + "9" * 5000 + "}}", "64 bits"),
    ('{"target": {"id": ' + "9" * 25 + "}}", "64 bits"),
    ('{"target": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested"),
    ('{"target": ' + '{"a":' * 80 + "1" + "}" * 80 + "}", "nested more than"),
    ("[1, 2]", "JSON object"),
    ("{not json", "not JSON"),
]


@pytest.mark.parametrize(("payload", "said"), HOSTILE_JSON)
def test_hostile_json_is_an_inline_error(operator_client: Client, payload: str, said: str) -> None:
    response = operator_client.post(ENQUEUE, {"operation": NESTED, "payload": payload})
    assert_refused(response)
    errors = form_of(response, NESTED).errors["payload"]
    assert any(said in e for e in errors), errors


def test_a_hostile_operation_name_is_refused(operator_client: Client) -> None:
    for name in (f"ping{NUL}", "x" * 5000):
        assert_refused(operator_client.post(ENQUEUE, {"operation": name}))
    # A browser cannot send a lone surrogate; its UTF-8 bytes (CESU-8) are the nearest thing.
    raw = operator_client.post(
        ENQUEUE, "operation=%ED%A0%80", content_type="application/x-www-form-urlencoded"
    )
    assert_refused(raw)


def test_an_operator_enqueues_with_flow_keys(operator_client: Client) -> None:
    response = operator_client.post(ENQUEUE, flat_post(keys=" account:42 , region:eu,"))
    [job] = assert_enqueued(FLAT, queue="dashop", count=1)
    assert response.status_code == 302
    assert job.flow_keys == ["account:42", "region:eu"] and job.fair_key == "account:42"


def test_a_bad_flow_key_is_shown_beside_its_input_and_nothing_is_stored(
    operator_client: Client,
) -> None:
    response = operator_client.post(ENQUEUE, flat_post(keys=f":no-family, {HOSTILE_SCRIPT}"))
    html = assert_refused(response)
    assert "must not start with" in html
    assert HOSTILE_SCRIPT not in html  # drawn back escaped
    refute_enqueued(FLAT)
