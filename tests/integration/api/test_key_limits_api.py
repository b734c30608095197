"""``/keys`` (flow key limits: read, set, remove; permitted and audited) and ``keys`` on
``POST /jobs`` and in the job's JSON, on both databases."""

from __future__ import annotations

import uuid
from urllib.parse import quote

import pytest

from jobs.claims import Completion, complete_jobs
from jobs.key_limits import cache
from jobs.keyed_claims import claim_keyed
from jobs.models import Job, KeyLimit, OperatorAction, Worker

from .conftest import assert_error_shape

pytestmark = pytest.mark.django_db

ROW_FIELDS = {"name", "concurrency", "rate", "burst", "weight", "updated_at"}


def stored(name: str) -> tuple:
    return KeyLimit.objects.values_list("concurrency", "rate", "burst", "weight").get(name=name)


def audit_rows() -> list[tuple]:
    return list(
        OperatorAction.objects.order_by("id").values_list("action", "target", "filter", "username")
    )


@pytest.fixture(autouse=True)
def _fresh_limits():
    """Claims read limits through a per-process cache: each test starts from the table."""
    cache.forget()
    yield
    cache.forget()


# --- reading and writing limit rows ---------------------------------------------------


def test_patch_sets_a_keys_limits_and_every_read_shows_them(operator):
    response = operator.request("PATCH", "/keys/account:42", {"concurrency": 2, "rate": 5})
    assert response.status_code == 200, response.content
    shown = response.json()
    assert set(shown) == ROW_FIELDS | {"running"}
    assert (shown["name"], shown["concurrency"], shown["rate"], shown["burst"]) == (
        "account:42",
        2,
        5.0,
        None,
    )
    assert (shown["weight"], shown["running"]) == (1.0, 0)
    assert stored("account:42") == (2, 5.0, None, 1.0)
    for path in ("/keys/account:42", "/keys/account:42/"):
        assert operator.get(path).json() == shown
    listed = operator.get("/keys").json()
    assert listed == [{k: v for k, v in shown.items() if k != "running"}]
    assert operator.get("/keys/").json() == listed


def test_the_list_is_ordered_by_name(operator):
    for name in ("zeta", "api:7", "account", "account:42"):
        assert operator.request("PATCH", f"/keys/{name}", {"weight": 2}).status_code == 200
    names = [row["name"] for row in operator.get("/keys").json()]
    assert names == ["account", "account:42", "api:7", "zeta"]


def test_a_field_left_out_keeps_its_value_and_null_clears_it(operator):
    operator.request("PATCH", "/keys/acct", {"concurrency": 3, "rate": 2, "burst": 4, "weight": 5})
    assert operator.request("PATCH", "/keys/acct/", {"rate": 0.5}).status_code == 200
    assert stored("acct") == (3, 0.5, 4.0, 5.0)
    body = {"concurrency": None, "burst": None, "weight": None}
    response = operator.request("PATCH", "/keys/acct", body)
    assert response.status_code == 200
    assert stored("acct") == (None, 0.5, None, 1.0)  # weight back to 1
    assert response.json()["running"] is None  # a family: no single key's count


def test_a_family_and_a_name_holding_a_slash_are_names_too(operator):
    assert operator.request("PATCH", "/keys/host:example.com/a", {"rate": 3}).status_code == 200
    assert stored("host:example.com/a")[1] == 3.0
    assert operator.get("/keys/host:example.com/a/").json()["name"] == "host:example.com/a"
    assert operator.request("DELETE", "/keys/host:example.com/a/").status_code == 204
    assert not KeyLimit.objects.exists()
    # Any character a key may hold: a line break, a percent sign, spaces, non-ASCII.
    for name in ("note:a\nb", "p:100%", "t: x ", "ünï:κ"):
        path = "/keys/" + quote(name, safe="")
        assert operator.request("PATCH", path, {"weight": 2}).status_code == 200, name
        assert operator.get(path + "/").json()["name"] == name
    assert [row["name"] for row in operator.get("/keys").json()] == sorted(
        ["note:a\nb", "p:100%", "t: x ", "ünï:κ"]
    )


def test_delete_removes_the_row_and_a_second_delete_is_a_404(operator):
    operator.request("PATCH", "/keys/account:42", {"concurrency": 1})
    response = operator.request("DELETE", "/keys/account:42")
    assert response.status_code == 204 and response.content == b""
    assert not KeyLimit.objects.exists()
    assert_error_shape(operator.request("DELETE", "/keys/account:42/"), 404)
    assert_error_shape(operator.get("/keys/account:42"), 404)


def test_a_name_without_limits_is_a_404(viewer):
    body = assert_error_shape(viewer.get("/keys/account:1"), 404)
    assert "PATCH /keys/<name>" in body["message"]


def test_each_change_is_an_audited_operator_action_of_its_caller(operator):
    operator.request("PATCH", "/keys/account:42", {"concurrency": 2})
    operator.request("PATCH", "/keys/account:42", {"rate": 1.5, "burst": None})
    operator.request("DELETE", "/keys/account:42")
    operator.request("DELETE", "/keys/account:42")  # nothing to delete: no row
    assert audit_rows() == [
        ("set_key_limits", "account:42", {"concurrency": 2}, "operator"),
        ("set_key_limits", "account:42", {"rate": 1.5, "burst": None}, "operator"),
        ("set_key_limits", "account:42", {"deleted": True}, "operator"),
    ]


def test_running_counts_the_running_jobs_that_carry_the_key(operator):
    queue = f"keys-api-{uuid.uuid4().hex[:6]}"
    worker = Worker.objects.create(name="keys-api", queues=["*"])
    for keys in (["account:42", "api:7"], ["api:7"], ["account:42"], ["account:420"]):
        operator.post("/jobs", {"operation": "ping", "queue": queue, "keys": keys})
    claimed = claim_keyed(queue=queue, worker_id=worker.id, limit=10, lease_seconds=30).jobs
    assert len(claimed) == 4
    operator.request("PATCH", "/keys/account:42", {"concurrency": 5})
    operator.request("PATCH", "/keys/api:7", {"concurrency": 5})
    assert operator.get("/keys/account:42").json()["running"] == 2
    assert operator.get("/keys/api:7").json()["running"] == 2
    complete_jobs([Completion(j.id, j.lease_token) for j in claimed])
    assert operator.get("/keys/account:42").json()["running"] == 0


# --- a limit set here is what claims obey ------------------------------------------------


def test_a_limit_set_through_patch_is_obeyed_by_the_keyed_claim(operator):
    queue = f"keys-api-{uuid.uuid4().hex[:6]}"
    worker = Worker.objects.create(name="keys-api", queues=["*"])
    for _ in range(4):
        response = operator.post("/jobs", {"operation": "ping", "queue": queue, "keys": ["t:1"]})
        assert response.status_code == 201, response.content

    def claim() -> list:
        return claim_keyed(queue=queue, worker_id=worker.id, limit=10, lease_seconds=30).jobs

    assert operator.request("PATCH", "/keys/t", {"concurrency": 1}).status_code == 200
    first = claim()
    assert len(first) == 1 and claim() == []
    assert operator.get("/keys/t:1").status_code == 404  # the family's row, not the key's
    # The key's own row wins over its family's.
    assert operator.request("PATCH", "/keys/t:1", {"concurrency": 3}).status_code == 200
    assert operator.get("/keys/t:1").json()["running"] == 1
    assert len(claim()) == 2 and claim() == []
    # Removed, the key obeys its family's 1 again: nothing more starts while three run.
    assert operator.request("DELETE", "/keys/t:1").status_code == 204
    complete_jobs([Completion(first[0].id, first[0].lease_token)])
    assert claim() == []


# --- who may ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/keys", None),
        ("GET", "/keys/account:42", None),
        ("PATCH", "/keys/account:42", {"concurrency": 9}),
        ("DELETE", "/keys/account:42", None),
    ],
)
def test_anonymous_callers_get_nothing(api_for, method, path, body):
    KeyLimit.objects.create(name="account:42", concurrency=1)
    for slash in ("", "/"):
        response = api_for("anonymous").request(method, path + slash, body)
        assert_error_shape(response, 401)
        assert "account" not in response.content.decode()
    assert stored("account:42") == (1, None, None, 1.0)


@pytest.mark.parametrize("role", ["viewer", "remote"])
def test_only_callers_who_may_change_jobs_change_limits(api_for, role):
    KeyLimit.objects.create(name="account:42", concurrency=1)
    api = api_for(role)
    assert_error_shape(api.request("PATCH", "/keys/account:42", {"concurrency": 9}), 403)
    assert_error_shape(api.request("PATCH", "/keys/fresh", {"concurrency": 9}), 403)
    assert_error_shape(api.request("DELETE", "/keys/account:42"), 403)
    assert stored("account:42") == (1, None, None, 1.0)
    assert KeyLimit.objects.count() == 1 and not OperatorAction.objects.exists()


def test_a_viewer_reads_and_a_remote_worker_does_not(api_for):
    KeyLimit.objects.create(name="account:42", concurrency=1)
    assert api_for("viewer").get("/keys").status_code == 200
    assert api_for("viewer").get("/keys/account:42").status_code == 200
    assert_error_shape(api_for("remote").get("/keys"), 403)


def test_an_admin_may(admin):
    assert admin.request("PATCH", "/keys/account", {"concurrency": 7}).status_code == 200
    assert stored("account") == (7, None, None, 1.0)


# --- hostile bodies and names -------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({"concurrency": 0}, "concurrency", "whole number from 1"),
        ({"concurrency": 2.5}, "concurrency", "whole number from 1"),
        ({"concurrency": "3"}, "concurrency", "whole number from 1"),
        ({"concurrency": True}, "concurrency", "whole number from 1"),
        ({"concurrency": 10**400}, "concurrency", "whole number from 1"),
        ({"rate": 0}, "rate", "above 0"),
        ({"rate": False}, "rate", "above 0"),
        ({"rate": 10**400}, "rate", "above 0"),
        ({"rate": [1]}, "rate", "above 0"),
        ({"burst": 0.5}, "burst", "from 1"),
        ({"weight": 0}, "weight", "from 0.01"),
        ({"weight": {"a": 1}}, "weight", "from 0.01"),
        ({"limit": 5}, "limit", "not known"),
        ({"concurrency": 2, "rates": 5}, "rates", "not known"),
        ({}, "limits", "Give at least one of"),
    ],
)
def test_bad_bodies_are_a_400_naming_the_field_and_store_nothing(operator, body, field, says):
    KeyLimit.objects.create(name="acct", concurrency=4, rate=3)
    errors = assert_error_shape(operator.request("PATCH", "/keys/acct", body), 400)["errors"]
    assert says in errors[field][0], errors
    assert stored("acct") == (4, 3.0, None, 1.0)
    errors = assert_error_shape(operator.request("PATCH", "/keys/fresh:1", body), 400)["errors"]
    assert field in errors
    assert KeyLimit.objects.count() == 1 and not OperatorAction.objects.exists()


@pytest.mark.parametrize(
    "raw",
    [
        "[1, 2]",
        "5",
        '"concurrency"',
        "null",
        "{",
        '{"rate": NaN}',
        '{"rate": Infinity}',
        '{"rate": 1e400}',
        '{"burst": -1e400}',
        '{"concurrency": 1' + "0" * 400 + "}",
        '{"weight": ' + "[" * 5000 + "]" * 5000 + "}",
        '{"rate\\u0000": 1}',
        '{"\\ud800": 1}',
        "\xff\xfe",
    ],
)
def test_bodies_that_are_not_an_object_of_numbers_are_a_400(operator, raw):
    response = operator.request("PATCH", "/keys/account:42", raw=raw)
    assert_error_shape(response, 400)
    assert not KeyLimit.objects.exists() and not OperatorAction.objects.exists()


def test_many_unknown_fields_are_named_ten_at_most(operator):
    body = {f"field{i}": 1 for i in range(500)}
    errors = assert_error_shape(operator.request("PATCH", "/keys/acct", body), 400)["errors"]
    assert len(errors) == 10
    assert not KeyLimit.objects.exists()


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("/keys/a%00b", "NUL"),
        ("/keys/:42", "must not start with ':'"),
        ("/keys/%20", "non-empty"),
        ("/keys/" + "k" * 201, "longer than"),
    ],
)
def test_names_no_key_can_have_are_a_400_on_every_method(operator, path, says):
    for method, body in (("GET", None), ("PATCH", {"concurrency": 1}), ("DELETE", None)):
        for slash in ("", "/"):
            errors = assert_error_shape(operator.request(method, path + slash, body), 400)
            assert says in errors["errors"]["name"][0], errors
    assert not KeyLimit.objects.exists() and not OperatorAction.objects.exists()


def test_unknown_query_parameters_are_a_400(viewer):
    assert_error_shape(viewer.get("/keys", limit=5), 400)


# --- keys on POST /jobs and in the job's JSON ---------------------------------------------


def test_post_jobs_takes_keys_and_every_read_of_the_job_shows_them(operator):
    response = operator.post("/jobs", {"operation": "ping", "keys": ["account:42", "api:7"]})
    assert response.status_code == 201, response.content
    job_id = response.json()["id"]
    job = Job.objects.get(pk=job_id)
    assert (job.flow_keys, job.fair_key) == (["account:42", "api:7"], "account:42")
    listed = operator.get("/jobs").json()["results"]
    for shown in (response.json(), operator.get(f"/jobs/{job_id}").json(), listed[0]):
        assert shown["id"] == job_id
        assert (shown["keys"], shown["priority_aged"]) == (["account:42", "api:7"], 0)


def test_a_job_without_keys_shows_an_empty_list(operator):
    for body in ({"operation": "ping"}, {"operation": "ping", "keys": None}):
        response = operator.post("/jobs", body)
        assert response.status_code == 201, response.content
        assert response.json()["keys"] == []
        assert Job.objects.get(pk=response.json()["id"]).flow_keys is None
    assert [j["keys"] for j in operator.get("/jobs").json()["results"]] == [[], []]


def test_a_key_template_is_filled_from_the_payload(operator):
    body = {"operation": "sleep", "payload": {"seconds": 0}, "keys": ["op:{operation}"]}
    response = operator.post("/jobs", body)
    assert response.status_code == 201, response.content
    assert response.json()["keys"] == ["op:sleep"]


@pytest.mark.parametrize(
    ("keys", "says"),
    [
        ("account:42", "must be a list"),
        ({"account": 42}, "must be a list"),
        (42, "must be a list"),
        ([42], "must be a string"),
        ([["account:42"]], "must be a string"),
        ([True], "must be a string"),
        ([""], "non-empty"),
        ([":42"], "must not start with ':'"),
        (["a\u0000b"], "NUL"),
        (["k" * 201], "longer than"),
        (["account:{account_id}"], "which the payload lacks"),
        ([f"k:{i}" for i in range(9)], "at most 8"),
        ([1] * 5000, "at most 8"),
    ],
)
def test_bad_keys_are_a_400_under_keys_and_store_nothing(operator, keys, says):
    response = operator.post("/jobs", {"operation": "ping", "keys": keys})
    errors = assert_error_shape(response, 400)["errors"]
    assert set(errors) == {"keys"}, errors
    assert any(says in message for message in errors["keys"]), errors
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    "raw",
    [
        '{"operation": "ping", "keys": ["a:\\ud800"]}',
        '{"operation": "ping", "keys": [1' + "0" * 400 + "]}",
        '{"operation": "ping", "keys": [1e400]}',
        '{"operation": "ping", "keys": [NaN]}',
        '{"operation": "ping", "keys": ' + "[" * 5000 + "]" * 5000 + "}",
    ],
)
def test_hostile_keys_are_a_4xx_and_store_nothing(operator, raw):
    response = operator.post("/jobs", raw=raw)
    assert 400 <= response.status_code < 500, (response.status_code, response.content[:300])
    assert set(response.json()) == {"message", "errors"}
    assert not Job.objects.exists()
