"""Flow control by key made visible: which keys hold jobs back (jobs.selectors.flow_keys),
the queues page's held-back keys and key limits form, and the job page's waiting reasons.

Keys are at their limit for real: jobs enqueued with ``keys=`` and started by the keyed
claim in-process, as a worker starts them. Both databases.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client

from jobs import operator_actions
from jobs.clock import db_now
from jobs.enqueue import JobSpec, enqueue, enqueue_many
from jobs.key_limits import RULES, cache
from jobs.keyed_claims import claim_keyed
from jobs.models import Job, KeyLimit, OperatorAction, Worker
from jobs.selectors.flow_keys import held_back, held_back_by_family, waiting_reason
from tests.factories import make_user, unique_queue
from tests.integration.dashboard.test_dash_actions import messages_of

KEYS = "/dashboard/queues/keys/"
REMOVE = "/dashboard/queues/keys/remove/"
HOSTILE = "<script>alert(1)</script>"


@pytest.fixture(autouse=True)
def _fresh_limits():
    cache.forget()
    yield
    cache.forget()


def start(queue: str, n: int = 10) -> list:
    """Start up to ``n`` keyed jobs of ``queue`` as a worker's claim does."""
    worker = Worker.objects.create(name="flow-keys-test", queues=[queue])
    return claim_keyed(queue=queue, worker_id=worker.id, limit=n, lease_seconds=60).jobs


@pytest.fixture
def at_limit(db):
    """``acct`` limited to 2 at once; acct:1 has 2 running and 3 ready, acct:2 1 running."""
    queue = unique_queue("keys")
    operator_actions.set_key_limits("acct", {"concurrency": 2}, user="test")
    one = enqueue_many([JobSpec("ping", queue=queue, keys=["acct:1"]) for _ in range(5)])
    two = enqueue("ping", queue=queue, keys=["acct:2"])
    started = {j.id for j in start(queue)}
    assert started == {one[0].id, one[1].id, two.id}
    return queue, one


# --- the reads --------------------------------------------------------------------


def test_a_key_at_its_limit_holds_back_its_ready_jobs(at_limit):
    queue, one = at_limit
    entry = held_back(queue)[queue]
    assert [(k.key, k.reason, k.held, k.oldest_id) for k in entry.keys] == [
        ("acct:1", "at its limit 2/2", 3, one[2].id)
    ]
    assert entry.total == 3 and entry.key_count == 1 and not entry.capped
    assert entry.keys[0].at_limit and not entry.keys[0].out_of_tokens
    assert 0 <= entry.keys[0].oldest_age < 60


def test_every_keyed_queue_has_an_entry_and_top_bounds_the_keys(at_limit, db):
    queue, _ = at_limit
    operator_actions.set_key_limits("acct:9", {"concurrency": 1}, user="test")
    enqueue_many([JobSpec("ping", queue=queue, keys=["acct:9"]) for _ in range(2)])
    quiet = unique_queue("quiet")
    enqueue("ping", queue=quiet, keys=["other:1"])
    start(queue)
    both = held_back()
    assert both[quiet].keys == [] and both[quiet].total == 0
    assert [k.key for k in both[queue].keys] == ["acct:1", "acct:9"]  # most held first
    assert both[queue].total == 4
    top = held_back(queue, top=1)[queue]
    assert [k.key for k in top.keys] == ["acct:1"] and top.key_count == 2 and top.total == 4
    assert unique_queue("none") not in held_back()


def test_a_key_out_of_tokens_holds_back_and_says_its_rate(db):
    queue = unique_queue("rate")
    operator_actions.set_key_limits("api", {"rate": 0.01, "burst": 1}, user="test")
    jobs = enqueue_many([JobSpec("ping", queue=queue, keys=["api:7"]) for _ in range(3)])
    assert len(start(queue)) == 1
    entry = held_back(queue)[queue]
    assert [(k.key, k.reason, k.held) for k in entry.keys] == [
        ("api:7", "out of tokens (0.01/s)", 2)
    ]
    assert entry.keys[0].out_of_tokens and not entry.keys[0].at_limit
    waiting = Job.objects.get(id=jobs[2].id)
    assert waiting_reason(waiting) == ["key api:7 out of tokens (rate 0.01/s)"]


def test_waiting_reasons_name_each_key_and_the_queues_own_limits(at_limit):
    queue, one = at_limit
    job = Job.objects.get(id=one[3].id)
    assert waiting_reason(job) == ["key acct:1 at its limit 2/2"]
    both = enqueue("ping", queue=queue, keys=["tenant:5", "acct:1"])
    assert waiting_reason(both) == ["key acct:1 at its limit 2/2"]
    assert waiting_reason(Job.objects.get(id=one[0].id)) == []  # running: nothing holds it
    operator_actions.set_paused(queue, True, user="test")
    operator_actions.set_concurrency_cap(queue, 3, user="test")
    assert waiting_reason(job) == [
        "queue paused",
        "queue at its cap 3/3",
        "key acct:1 at its limit 2/2",
    ]


def test_nothing_holds_back_a_free_key_an_unkeyed_job_or_a_later_one(db):
    queue = unique_queue("free")
    operator_actions.set_key_limits("acct", {"concurrency": 2}, user="test")
    free = enqueue("ping", queue=queue, keys=["acct:3"])
    plain = enqueue("ping", queue=queue)
    later = enqueue("ping", queue=queue, keys=["acct:3"], run_after=db_now() + timedelta(hours=1))
    assert waiting_reason(free) == [] and waiting_reason(plain) == []
    assert waiting_reason(later) == []
    assert held_back(queue)[queue].keys == []


def test_metrics_aggregate_by_family(at_limit):
    queue, _ = at_limit
    operator_actions.set_key_limits("api", {"rate": 5}, user="test")
    found = held_back_by_family()
    assert found[(queue, "acct")] == (3, 1)
    assert found[(queue, "api")] == (0, 0)  # limited, holding nothing: the series stays


# --- the queues page --------------------------------------------------------------


def test_the_queues_page_shows_the_keys_holding_jobs_back(at_limit, viewer_client: Client):
    queue, one = at_limit
    html = viewer_client.get("/dashboard/queues/").content.decode()
    assert "Keys holding jobs back" in html
    assert f'data-held-queue="{queue}"' in html
    assert 'data-key="acct:1"' in html and "at its limit 2/2" in html
    assert f"/dashboard/jobs/{one[2].id}/" in html  # the oldest waiting job, linked
    assert 'data-key="acct:2"' not in html  # below its limit
    assert 'data-key-limit="acct"' in html  # the limits table
    assert 'name="concurrency"' not in html  # a viewer gets no form
    live = viewer_client.get("/dashboard/queues/?live=1").content.decode()
    assert 'data-key="acct:1"' in live  # the live body carries it too


def test_the_job_page_says_why_a_queued_job_is_not_starting(at_limit, viewer_client: Client):
    _queue, one = at_limit
    html = viewer_client.get(f"/dashboard/jobs/{one[4].id}/").content.decode()
    assert "Not starting yet" in html and "key acct:1 at its limit 2/2" in html
    assert '<code class="flow-key">acct:1</code>' in html
    live = viewer_client.get(f"/dashboard/jobs/{one[4].id}/live/").content.decode()
    assert "key acct:1 at its limit 2/2" in live
    running = viewer_client.get(f"/dashboard/jobs/{one[0].id}/").content.decode()
    assert "Not starting yet" not in running and "flow-key" in running


# --- the key limits form ----------------------------------------------------------


def test_an_operator_sets_and_removes_limits_audited(operator_client: Client):
    response = operator_client.post(
        KEYS,
        {"name": "tenant", "concurrency": "3", "rate": "2.5", "burst": "", "weight": "2"},
        follow=True,
    )
    assert "Key limits of tenant: concurrency 3, rate 2.5/s, weight 2." in messages_of(response)
    row = KeyLimit.objects.get(name="tenant")
    assert (row.concurrency, row.rate, row.burst, row.weight) == (3, 2.5, None, 2.0)
    html = operator_client.get("/dashboard/queues/").content.decode()
    assert 'data-key-limit="tenant"' in html and 'value="2.5"' in html
    assert "Key limits" in html and "concurrency 3" in html  # the audit table

    response = operator_client.post(REMOVE, {"name": "tenant"}, follow=True)
    assert "limits of tenant are removed" in messages_of(response)
    assert not KeyLimit.objects.filter(name="tenant").exists()
    actions = OperatorAction.objects.filter(action="set_key_limits").order_by("id")
    assert [(a.target, a.filter) for a in actions] == [
        ("tenant", {"concurrency": 3, "rate": 2.5, "burst": None, "weight": 2.0}),
        ("tenant", {"deleted": True}),
    ]
    response = operator_client.post(REMOVE, {"name": "tenant"}, follow=True)
    assert "nothing changed" in messages_of(response)
    assert OperatorAction.objects.filter(action="set_key_limits").count() == 2


@pytest.mark.parametrize(
    ("form", "rule"),
    [
        ({"concurrency": "abc"}, RULES["concurrency"]),
        ({"concurrency": "2.5"}, RULES["concurrency"]),
        ({"concurrency": "0"}, RULES["concurrency"]),
        ({"rate": "0"}, RULES["rate"]),
        ({"rate": "nan"}, RULES["rate"]),
        ({"burst": "0.5"}, RULES["burst"]),
        ({"weight": "1e400"}, RULES["weight"]),
        ({"name": ""}, "non-empty"),
        ({"name": ":x"}, "must not start with ':'"),
    ],
)
def test_bad_input_shows_the_rule_and_stores_nothing(operator_client: Client, form, rule):
    KeyLimit.objects.create(name="acct", concurrency=2)
    response = operator_client.post(KEYS, {"name": "acct", **form}, follow=True)
    assert rule in messages_of(response) and "Nothing was changed" in messages_of(response)
    assert KeyLimit.objects.get(name="acct").concurrency == 2
    assert KeyLimit.objects.count() == 1
    assert not OperatorAction.objects.exists()


def test_a_viewer_may_not_set_or_remove_limits(viewer_client: Client):
    KeyLimit.objects.create(name="acct", concurrency=2)
    assert viewer_client.post(KEYS, {"name": "acct", "concurrency": "9"}).status_code == 403
    assert viewer_client.post(REMOVE, {"name": "acct"}).status_code == 403
    assert KeyLimit.objects.get(name="acct").concurrency == 2
    assert not OperatorAction.objects.exists()


@pytest.mark.django_db
def test_setting_limits_needs_a_csrf_token():
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("operator"))
    assert client.post(KEYS, {"name": "acct", "concurrency": "2"}).status_code == 403
    assert not KeyLimit.objects.exists()
    token = str(client.get("/dashboard/queues/").context["csrf_token"])
    form = {"name": "acct", "concurrency": "2", "csrfmiddlewaretoken": token}
    assert client.post(KEYS, form).status_code == 302
    assert KeyLimit.objects.get(name="acct").concurrency == 2


# --- keys are user data -------------------------------------------------------------


def test_a_hostile_key_is_shown_escaped_everywhere(operator_client: Client):
    queue = unique_queue("hostile")
    operator_client.post(KEYS, {"name": HOSTILE, "concurrency": "1"})
    assert KeyLimit.objects.get(name=HOSTILE).concurrency == 1
    jobs = enqueue_many([JobSpec("ping", queue=queue, keys=[HOSTILE]) for _ in range(2)])
    assert len(start(queue)) == 1
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;"
    for url in (
        "/dashboard/queues/",
        "/dashboard/queues/?live=1",
        f"/dashboard/jobs/{jobs[1].id}/",
    ):
        html = operator_client.get(url).content.decode()
        assert HOSTILE not in html, url
        assert escaped in html, url
    job_page = operator_client.get(f"/dashboard/jobs/{jobs[1].id}/").content.decode()
    assert f"key {escaped} at its limit 1/1" in job_page
