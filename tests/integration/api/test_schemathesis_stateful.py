"""schemathesis, stateful: enqueue, then register a remote worker, claim, complete (or emit, fail).

``test_schema.py`` fuzzes every operation of ``/schema`` on its own; most
remote-worker calls then meet a 404 or a 409, because a random worker id or
lease token names nothing. Here schemathesis chains calls through OpenAPI
links, so the remote-worker routes are fuzzed with real ids and real lease
tokens:

    POST /jobs (201) -> POST /workers (serving that job's operation and queue)
      -> POST /workers/{id}/claim -> POST /jobs/{id}/complete | events | fail
    POST /workers (201) -> PATCH | DELETE /workers/{id}
    POST /jobs (201) -> GET /jobs/{id}

Few links on purpose: each one is a rule Hypothesis picks among the enabled
ones, so every extra link makes the three-step chain rarer.

The document itself has no links; they are added to the test's copy of it
(``LINKS``), and the enqueue body is narrowed to ``ping`` with an empty
payload so that positive cases create jobs a worker can claim (random
operation names are the stateless test's business). Every answer must be
below 500; a documented status must match its documented body; every 4xx
keeps the one error shape. Server errors are collected with their request,
response and traceback (from the ``django.request`` log) instead of stopping
at the first. Bounded: ``SCENARIOS`` scenarios of up to ``STEPS`` calls and a
``BUDGET_SECONDS`` wall-clock cut.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from collections import Counter
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.wsgi import get_wsgi_application
from django.test import Client
from hypothesis import HealthCheck, Phase, settings
from hypothesis.errors import Flaky
from rest_framework.authtoken.models import Token

SCENARIOS = 150
STEPS = 12
BUDGET_SECONDS = 120.0
MAX_ROUNDS = 20  # Hypothesis runs (see ``Flaky`` below)
WAIT_CAP = 0.05  # a fuzzed claim long-polls at most this long

CLAIMED = "$response.body#/jobs/0"
LINKS: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {
    ("/jobs", "post", "201"): {
        "GetJob": {"operationId": "jobs_retrieve", "parameters": {"job_id": "$response.body#/id"}},
        "RegisterWorkerForIt": {
            "operationId": "workers_register",
            "requestBody": {
                "operations": ["$response.body#/operation"],
                "queues": ["$response.body#/queue"],
            },
        },
    },
    ("/workers", "post", "201"): {
        "Claim": {
            "operationId": "workers_claim",
            "parameters": {"worker_id": "$response.body#/id"},
            "requestBody": {"limit": 1, "wait": 0},
        },
        "Heartbeat": {
            "operationId": "workers_heartbeat",
            "parameters": {"worker_id": "$response.body#/id"},
        },
        "Disconnect": {
            "operationId": "workers_disconnect",
            "parameters": {"worker_id": "$response.body#/id"},
        },
    },
    ("/workers/{worker_id}/claim", "post", "200"): {
        name: {
            "operationId": operation_id,
            "parameters": {"job_id": f"{CLAIMED}/id"},
            "requestBody": {"lease_token": f"{CLAIMED}/lease_token"},
        }
        for name, operation_id in (
            ("Complete", "jobs_complete"),
            ("Emit", "jobs_events_create"),
            ("Fail", "jobs_fail"),
        )
    },
}


NAME = {"type": "string", "minLength": 1, "maxLength": 40, "pattern": "^[a-z][a-z0-9_.-]*$"}
TEXT = {"type": "string", "maxLength": 80, "pattern": "^[ -~]*$"}  # printable ASCII
SMALL_OBJECT = {"type": "object", "maxProperties": 3, "additionalProperties": {"type": "integer"}}
# Request bodies of the test's copy: values a real client sends, so that the
# chain gets through (NUL, surrogates, deep nesting and unknown names are
# the stateless test's and test_hostile_input.py's business).
NARROWED: dict[str, dict[str, Any]] = {
    "EnqueueRequest": {
        "operation": {"type": "string", "enum": ["ping"]},
        "payload": {"type": "object", "maxProperties": 0},
        "queue": NAME,
        "priority": {"type": "integer", "minimum": -100, "maximum": 100},
    },
    "RegisterBodyRequest": {
        "name": NAME,
        "operations": {
            "type": "array",
            "items": {"type": "string", "enum": ["ping"]},
            "minItems": 1,
            "maxItems": 1,
        },
        "queues": {"type": "array", "items": NAME, "minItems": 1, "maxItems": 3},
        "concurrency": {"type": "integer", "minimum": 1, "maximum": 8},
    },
    "CompleteBodyRequest": {"lease_token": {"type": "string"}, "result": SMALL_OBJECT},
    "EventBodyRequest": {
        "lease_token": {"type": "string"},
        "event": NAME,
        "message": TEXT,
        "level": {"type": "string", "enum": ["info", "warning", "error"]},
        "fields": SMALL_OBJECT,
    },
    "FailBodyRequest": {
        "lease_token": {"type": "string"},
        "error_code": NAME,
        "error_message": TEXT,
        "retryable": {"type": "boolean"},
    },
}


# The operations the chains go through; the rest (lists, bulk actions, queue
# pauses, which would also stop the claims) are the stateless test's.
CHAINED = sorted(
    {"jobs_enqueue"} | {link["operationId"] for links in LINKS.values() for link in links.values()}
)


def linked_document(document: dict[str, Any]) -> dict[str, Any]:
    """The test's copy of ``/schema``: ``LINKS`` added, the chain's request bodies narrowed."""
    doc = copy.deepcopy(document)
    for (path, method, status), links in LINKS.items():
        response = doc["paths"][path][method]["responses"][status]
        response.setdefault("links", {}).update(links)
    for name, properties in NARROWED.items():
        component = doc["components"]["schemas"][name]
        assert set(properties) <= set(component["properties"]), (name, component)
        component["properties"] = properties
        component["additionalProperties"] = False
    return doc


def shown(body: Any, limit: int = 300) -> str:
    """A request body for a failure report (``NotSet`` and non-JSON values included)."""
    try:
        return json.dumps(body)[:limit]
    except (TypeError, ValueError):
        return repr(body)[:limit]


class ServerErrors(logging.Handler):
    """Keeps the tracebacks Django logs for 5xx answers (``django.request``)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + "".join(logging.Formatter().formatException(record.exc_info))
        self.records.append(text)


@pytest.mark.timeout(240)
@pytest.mark.django_db(transaction=True)
def test_stateful_links_find_no_server_errors():
    import schemathesis
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_schema_conformance,
    )

    started = time.monotonic()
    user = User.objects.create_superuser("stateful", "s@example.com", None)
    headers = {"Authorization": f"Token {Token.objects.create(user=user).key}"}
    raw = Client(headers=headers).get("/schema", HTTP_ACCEPT="application/json")
    assert raw.status_code == 200, raw.content[:300]
    schema = schemathesis.openapi.from_dict(linked_document(json.loads(raw.content)))
    schema = schema.include(operation_id=CHAINED)
    # Only the links above: inferred ones (GET /workers/{id} -> claim …) would
    # dilute the chains among two dozen more rules.
    schema.config.phases.stateful.inference.algorithms = []
    schema.app = get_wsgi_application()
    checks = [not_a_server_error, response_schema_conformance, content_type_conformance]
    failures: list[str] = []
    statuses: Counter[tuple[str, int]] = Counter()
    chains: Counter[str] = Counter()

    class Machine(schema.as_state_machine()):  # type: ignore[misc]
        def setup(self) -> None:
            chains["scenarios"] += 1

        def before_call(self, case) -> None:
            body = case.body
            if isinstance(body, dict) and isinstance(body.get("wait"), (int, float)):
                body["wait"] = max(0.0, min(float(body["wait"]), WAIT_CAP))

        def get_call_kwargs(self, case) -> dict[str, Any]:
            return {"headers": headers}

        def step(self, input):  # noqa: A002 - schemathesis names it so
            if time.monotonic() - started > BUDGET_SECONDS:
                return None  # out of time: the remaining steps send nothing
            return super().step(input)

        def after_call(self, response, case) -> None:
            label = f"{case.method} {case.path}"
            statuses[(label, response.status_code)] += 1
            if label == "POST /workers/{worker_id}/claim" and response.status_code == 200:
                if response.json().get("jobs"):
                    chains["claimed"] += 1
            elif label == "POST /jobs/{job_id}/complete" and response.status_code == 200:
                chains["completed"] += 1

        def validate_response(self, response, case, additional_checks=None, **kwargs) -> None:
            try:
                case.validate_response(response, checks=checks, headers=headers)
            except (AssertionError, BaseExceptionGroup) as error:
                failures.append(
                    f"{case.method} {case.formatted_path} body={shown(case.body)} -> "
                    f"{response.status_code} {response.text[:300]}: {str(error)[:400]}"
                )
                return
            if response.status_code >= 400:
                body = response.json()
                if set(body) != {"message", "errors"}:
                    failures.append(f"{case.method} {case.formatted_path}: error shape {body}")

    errors = ServerErrors()
    logging.getLogger("django.request").addHandler(errors)
    rounds: Counter[str] = Counter()
    try:
        # A round ends early when Hypothesis notices that replaying a scenario
        # drew differently (``Flaky``): the database remembers earlier rounds,
        # so the responses a scenario builds on change. schemathesis's own
        # runner starts another suite then; so does this loop, within the budget.
        while chains["scenarios"] < SCENARIOS and time.monotonic() - started < BUDGET_SECONDS:
            rounds["run"] += 1
            try:
                Machine.run(
                    settings=settings(
                        max_examples=SCENARIOS - chains["scenarios"],
                        stateful_step_count=STEPS,
                        deadline=None,
                        database=None,
                        phases=[Phase.generate],
                        suppress_health_check=list(HealthCheck),
                    )
                )
            except Flaky:
                rounds["flaky"] += 1
            if rounds["run"] >= MAX_ROUNDS:
                break
    finally:
        logging.getLogger("django.request").removeHandler(errors)
        # A parked claim started the process's LISTEN connection (PostgreSQL); it
        # would keep the test database from being dropped. The next user restarts it.
        from django_controlplane.web.listener import listener

        listener.stop()
    print(
        f"stateful: {chains['scenarios']} scenarios in {rounds['run']} rounds "
        f"({rounds['flaky']} ended by Flaky), {sum(statuses.values())} calls, "
        f"{chains['claimed']} claims with a job, {chains['completed']} completions; "
        + ", ".join(f"{label} {code}: {n}" for (label, code), n in sorted(statuses.items()))
    )
    report = "\n".join(failures + errors.records)
    assert not failures and not errors.records, report
    seen = {label for label, _ in statuses}
    assert {
        "POST /jobs",
        "POST /workers",
        "POST /workers/{worker_id}/claim",
        "POST /jobs/{job_id}/complete",
    } <= seen, statuses
    assert chains["claimed"] and chains["completed"], (chains, rounds, statuses)
    assert time.monotonic() - started < BUDGET_SECONDS + 60
