"""Enqueue from Python and the CLI: storage, idempotency, validation, operations."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import uuid
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction
from django.utils import timezone

from django_controlplane.testing import assert_enqueued, drain_jobs
from jobs.conf import knob
from jobs.enqueue import JobSpec, enqueue, enqueue_many
from jobs.exceptions import EnqueueError, UnknownOperation
from jobs.models import Job, JobEvent
from jobs.operations import Operation, discover_operations, operation, registry
from tests.factories import assert_consistent, fresh, queued, timeline
from tests.integration.timelines import timeline_of

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[3]


def stored() -> tuple[int, int]:
    return Job.objects.count(), JobEvent.objects.count()


# --- storing jobs ---------------------------------------------------------------


def test_enqueue_stores_a_queued_job_with_its_first_event():
    job = enqueue("sleep", {"seconds": 0.5}, priority=7, max_attempts=2)
    row = fresh(job)
    assert row.pk == job.pk and not job._state.adding
    assert (row.operation, row.queue, row.status, row.priority) == ("sleep", "default", "queued", 7)
    assert (row.payload, row.attempts, row.max_attempts, row.parent_id) == (
        {"seconds": 0.5},
        0,
        2,
        None,
    )
    assert row.run_after <= timezone.now() and row.created_at <= timezone.now()
    assert assert_consistent(job) == [(1, "job.enqueued")]


def test_enqueue_takes_the_operations_defaults_and_the_callers_options():
    assert fresh(enqueue("fail", {"message": "m"})).max_attempts == 3
    later = timezone.now() + timedelta(hours=1)
    job = fresh(enqueue("ping", queue="elsewhere", run_after=later, priority=-100))
    assert (job.queue, job.run_after, job.priority) == ("elsewhere", later, -100)
    assert fresh(enqueue("ping", priority=100)).priority == 100


def test_enqueue_many_returns_jobs_in_order():
    specs = [JobSpec("sleep", {"seconds": i}, priority=i % 3) for i in range(5)]
    jobs = enqueue_many(specs)
    assert [j.payload["seconds"] for j in jobs] == list(range(5))
    assert [fresh(j).priority for j in jobs] == [0, 1, 2, 0, 1]
    assert enqueue_many([]) == []


def test_enqueue_many_of_1000_takes_a_bounded_number_of_queries(django_assert_max_num_queries):
    with django_assert_max_num_queries(6):
        jobs = enqueue_many([JobSpec("ping", queue="bulk") for _ in range(1000)])
    assert len({j.pk for j in jobs}) == 1000
    assert Job.objects.filter(queue="bulk", status="queued").count() == 1000
    # One row per job and no event row: each job.enqueued is implied (jobs.timeline).
    assert not JobEvent.objects.filter(job__queue="bulk").exists()
    assert set(Job.objects.filter(queue="bulk").values_list("last_event_seq", flat=True)) == {1}
    assert timeline_of(jobs[0]) == timeline_of(jobs[-1]) == [(1, "job.enqueued")]


def test_enqueue_many_beyond_one_chunk_still_takes_few_queries(django_assert_max_num_queries):
    with django_assert_max_num_queries(10):
        enqueue_many([JobSpec("ping", queue="bulk") for _ in range(2500)])
    assert Job.objects.filter(queue="bulk").count() == 2500


def test_one_spec_repeated_makes_a_job_each_time():
    """``[spec] * n`` is checked once (``jobs.job_spec.again``) and still stores n jobs."""
    later = timezone.now() + timedelta(hours=1)
    spec = JobSpec(
        "sleep",
        {"seconds": 1},
        queue="rep",
        priority=4,
        run_after=later,
        max_attempts=2,
        timeout_seconds=9.0,
    )
    jobs = enqueue_many([spec] * 3 + [JobSpec("ping", queue="rep")] + [spec])
    assert len({j.pk for j in jobs}) == 5
    rows = [fresh(j) for j in jobs]
    assert [r.operation for r in rows] == ["sleep"] * 3 + ["ping", "sleep"]
    for row in rows[:3] + rows[4:]:
        assert (row.queue, row.priority, row.run_after, row.max_attempts, row.timeout_seconds) == (
            "rep",
            4,
            later,
            2,
            9.0,
        )
        assert row.payload == {"seconds": 1}
    # The returned jobs (a repeat's is copied from the job before) match their rows.
    for job, row in zip(jobs, rows, strict=True):
        assert job._state is not jobs[0]._state or job is jobs[0]
        assert not job._state.adding and job._state.db == "default"
        for field in Job._meta.concrete_fields:
            assert getattr(job, field.attname) == getattr(row, field.attname), field.name
    # A retry override is the job's own dict, not one shared between the jobs.
    retried = enqueue_many([JobSpec("ping", retry={"max_retry_later": 0})] * 2)
    assert retried[0].retry_policy == retried[1].retry_policy == {"max_retry_later": 0}
    assert retried[0].retry_policy is not retried[1].retry_policy
    # An invalid spec repeated is refused at each index.
    with pytest.raises(EnqueueError) as info:
        enqueue_many([JobSpec("ping", priority=101)] * 2)
    assert set(info.value.errors) == {"0.priority", "1.priority"}
    # A repeated unique key: the first stores, the repeats return it.
    keyed = enqueue_many([JobSpec("ping", unique_key="rep-1")] * 3)
    assert len({j.pk for j in keyed}) == 1 and [j.duplicate for j in keyed][1:] == [True, True]


# --- idempotency --------------------------------------------------------------------


def test_idempotency_key_returns_the_first_job():
    first = enqueue("sleep", {"seconds": 1}, idempotency_key="order-42")
    again = enqueue("sleep", {"seconds": 2}, idempotency_key="order-42")
    assert again.pk == first.pk
    assert again.payload == {"seconds": 1}
    [only] = assert_enqueued("sleep", count=1)
    assert (only.pk, only.unique_key) == (first.pk, "order-42")
    assert timeline(first) == [(1, "job.enqueued")]


def test_idempotency_key_inside_enqueue_many():
    first = enqueue("ping", idempotency_key="k-1")
    jobs = enqueue_many(
        [
            JobSpec("ping", idempotency_key="k-1"),
            JobSpec("ping", idempotency_key="k-2"),
            JobSpec("ping"),
            JobSpec("ping", idempotency_key="k-2"),
        ]
    )
    assert jobs[0].pk == first.pk
    assert jobs[3].pk == jobs[1].pk
    assert len({j.pk for j in jobs}) == 3
    assert_enqueued(count=3)
    assert not JobEvent.objects.exists()  # enqueue stores no event row
    for pk in {j.pk for j in jobs}:
        assert timeline_of(pk) == [(1, "job.enqueued")]  # one each, duplicates add none


# --- the caller's transaction -----------------------------------------------------------


def test_enqueue_inside_a_rolled_back_transaction_leaves_nothing():
    before = stored()
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            enqueue("ping")
            enqueue_many([JobSpec("ping") for _ in range(10)])
            assert Job.objects.count() == before[0] + 11
            raise RuntimeError("the caller changed its mind")
    assert stored() == before


def test_enqueue_inside_a_committed_transaction_is_kept():
    with transaction.atomic():
        job = enqueue("ping")
    assert fresh(job).status == "queued"


# --- bad input --------------------------------------------------------------------------


def _refused(field: str, *args, **kwargs) -> EnqueueError:
    before = stored()
    with pytest.raises(EnqueueError) as info:
        enqueue(*args, **kwargs)
    error = info.value
    assert field in error.errors, error.errors
    assert all(isinstance(m, str) and m for m in error.errors[field])
    assert "not enqueued" in str(error) or "Unknown operation" in str(error)
    assert stored() == before
    return error


def test_unknown_operation():
    error = _refused("operation", "no.such.operation", {})
    [message] = error.errors["operation"]
    assert message.startswith("Unknown operation 'no.such.operation': no local operation")
    assert "no remote worker has declared it in the last 24 hours" in message
    with pytest.raises(UnknownOperation, match="register it or check the spelling"):
        registry.get("no.such.operation")


@pytest.mark.parametrize(
    "operation_name,payload,field",
    [
        ("sleep", {"seconds": "soon"}, "payload.seconds"),
        ("sleep", {"seconds": -1}, "payload.seconds"),
        ("sleep", {}, "payload.seconds"),
        ("retry_later", {"times": 1.5, "delay": 0}, "payload.times"),
        ("retry_later", {"times": 1}, "payload.delay"),
        ("retry_later", {"delay": 1}, "payload.times"),
        ("retry_later", {"times": 1, "delay": -1}, "payload.delay"),
        ("fanout", {"batches": 0}, "payload.batches"),
        ("fail", {"message": "m", "retryable": "yes"}, "payload.retryable"),
        ("fail", {}, "payload.message"),
        ("fail", {"message": 3}, "payload.message"),
        ("ping", {"unexpected": 1}, "payload"),
    ],
)
def test_invalid_payload_names_the_field(operation_name, payload, field):
    error = _refused(field, operation_name, payload)
    assert field in error.errors


@pytest.mark.parametrize("priority", [-101, 101, 1000, "5", 1.5, None, True])
def test_priority_out_of_range(priority):
    error = _refused("priority", "ping", {}, priority=priority)
    assert "-100 to 100" in error.errors["priority"][0]


@pytest.mark.parametrize("payload", [[1, 2], "text", 3, True])
def test_payload_must_be_a_json_object(payload):
    error = _refused("payload", "ping", payload)
    assert "JSON object" in error.errors["payload"][0]


def test_oversized_payload_is_refused(settings):
    settings.CONTROLPLANE = {"MAX_PAYLOAD_BYTES": 100}
    assert knob("MAX_PAYLOAD_BYTES") == 100
    error = _refused("payload", "fail", {"message": "x" * 200})
    assert "limit is 100 bytes" in error.errors["payload"][0]
    assert enqueue("fail", {"message": "x" * 50}).pk  # under the limit it is fine


def test_oversized_payload_through_the_environment(monkeypatch):
    monkeypatch.setenv("CONTROLPLANE_MAX_PAYLOAD_BYTES", "64")
    error = _refused("payload", "fail", {"message": "y" * 100})
    assert "limit is 64 bytes" in error.errors["payload"][0]


@pytest.mark.parametrize(
    "options,field",
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"run_after": datetime(2030, 1, 1)}, "run_after"),
        ({"queue": "  "}, "queue"),
        ({"idempotency_key": ""}, "idempotency_key"),
        ({"idempotency_key": "k" * 256}, "idempotency_key"),
    ],
)
def test_other_bad_options(options, field):
    _refused(field, "ping", {}, **options)


def test_one_bad_spec_stores_none_of_the_batch():
    before = stored()
    specs = [JobSpec("ping"), JobSpec("ping", priority=101), JobSpec("nope"), JobSpec("ping")]
    with pytest.raises(EnqueueError) as info:
        enqueue_many(specs)
    assert set(info.value.errors) == {"1.priority", "2.operation"}
    assert stored() == before


# --- parents ------------------------------------------------------------------------------


def test_parent_must_exist():
    for parent in (uuid.uuid4(), str(uuid.uuid4()), "not-a-uuid"):
        error = _refused("parent", "ping", {}, parent=parent)
        assert "does not exist" in str(error)


def test_parent_is_recorded():
    parent = queued()
    child = enqueue("ping", parent=parent.pk)
    by_text = enqueue("ping", parent=str(parent.pk))
    by_hex = enqueue("ping", parent=parent.pk.hex)
    assert {fresh(j).parent_id for j in (child, by_text, by_hex)} == {parent.pk}
    children = assert_enqueued("ping", parent=parent, count=3)
    assert {j.pk for j in children} == {child.pk, by_text.pk, by_hex.pk}


# --- operations ------------------------------------------------------------------------------


def test_diagnostics_are_registered_by_default():
    names = set(registry.names())
    assert {"ping", "sleep", "fail", "retry_later", "fanout", "django.task"} <= names
    for name in ("ping", "sleep", "fail", "retry_later", "fanout"):
        assert registry.get(name).queue == "default"
        assert registry.get(name).description


@pytest.fixture
def scratch_registry():
    """Operations a test registers are gone afterwards."""
    before = set(registry.names())
    yield registry
    for name in set(registry.names()) - before:
        registry.unregister(name)


def test_register_with_the_operation_decorator(scratch_registry):
    schema = {
        "type": "object",
        "required": ["n"],
        "properties": {"n": {"type": "integer"}},
        "additionalProperties": False,
    }

    @operation("test.double", queue="maths", max_attempts=4, payload_schema=schema)
    def double(ctx, payload):
        """Doubles n."""
        ctx.emit("double.seen", n=payload["n"])
        return payload["n"] * 2

    assert double.__name__ == "double"  # the function itself is returned
    op = registry.get("test.double")
    assert (op.queue, op.max_attempts, op.description) == ("maths", 4, "Doubles n.")

    job = enqueue("test.double", {"n": 21})
    assert (fresh(job).queue, fresh(job).max_attempts) == ("maths", 4)
    _refused("payload.n", "test.double", {"n": "x"})

    assert drain_jobs(queues=["maths"]).job_ids == [job.pk]
    assert fresh(job).result == 42
    assert [e for _, e in assert_consistent(job)] == [
        "job.enqueued",
        "job.started",
        "double.seen",
        "job.succeeded",
    ]


def test_register_an_operation_subclass(scratch_registry):
    @registry.register
    class Greet(Operation):
        name = "test.greet"
        queue = "greetings"
        payload_schema = {
            "type": "object",
            "required": ["who"],
            "properties": {"who": {"type": "string"}},
        }

        def execute(self, ctx, payload):
            return f"hello {payload['who']}"

    assert Greet.name == "test.greet"  # the class itself is returned
    job = enqueue("test.greet", {"who": "world"})
    assert fresh(job).queue == "greetings"
    _refused("payload.who", "test.greet", {})
    assert drain_jobs(queues=["greetings"]).counts == {"succeeded": 1}
    assert fresh(job).result == "hello world"


def test_registering_without_a_name_or_with_a_bad_schema_is_refused(scratch_registry):
    class Nameless(Operation):
        pass

    with pytest.raises(ValueError, match="no name"):
        registry.register(Nameless)

    class BadSchema(Operation):
        name = "test.bad_schema"
        payload_schema = {"type": "no-such-type"}

    with pytest.raises(Exception, match="no-such-type"):
        registry.register(BadSchema)
    assert "test.bad_schema" not in registry


def test_operation_modules_from_settings_are_discovered(settings, scratch_registry):
    module = f"{__package__}.discovered_ops"
    sys.modules.pop(module, None)
    settings.CONTROLPLANE = {"OPERATION_MODULES": ["jobs.diagnostics", module]}
    assert "foundation.discovered" not in registry

    discover_operations(list(knob("OPERATION_MODULES")))

    assert registry.get("foundation.discovered").queue == "discovered"
    assert fresh(enqueue("foundation.discovered", {"a": 1})).queue == "discovered"
    sys.modules.pop(module, None)


def test_operation_modules_are_discovered_at_start_up():
    """A fresh process imports the modules named by the setting (here via its env override)."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "CONTROLPLANE_OPERATION_MODULES": (
            "jobs.diagnostics,jobs.tasks_backend,tests.integration.foundation.discovered_ops"
        ),
    }
    code = (
        "import django; django.setup(); from jobs.operations import registry; "
        "print(sorted(n for n in registry.names() if n in "
        "('foundation.discovered', 'ping', 'django.task')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['django.task', 'foundation.discovered', 'ping']"


# --- the enqueue command ------------------------------------------------------------------------


def run_enqueue(*args: str) -> str:
    out = io.StringIO()
    call_command("enqueue", *args, stdout=out)
    return out.getvalue().strip()


def test_cli_prints_the_new_jobs_id():
    printed = run_enqueue("ping")
    [job] = assert_enqueued("ping", queue="default", count=1)
    assert (str(job.pk), job.status, job.payload) == (printed, "queued", {})


def test_cli_options():
    printed = run_enqueue(
        "sleep",
        "--payload",
        '{"seconds": 0.25}',
        "--queue",
        "cli",
        "--priority",
        "-5",
        "--run-after",
        "2030-01-02T03:04:05+00:00",
    )
    [job] = assert_enqueued("sleep", queue="cli", payload={"seconds": 0.25}, count=1)
    assert (str(job.pk), job.payload, job.priority) == (printed, {"seconds": 0.25}, -5)
    assert job.run_after.isoformat() == "2030-01-02T03:04:05+00:00"


@pytest.mark.parametrize(
    "args,expected",
    [
        (["ping", "--payload", "{not json"], "--payload is not valid JSON"),
        (["no.such.op"], "Unknown operation 'no.such.op'"),
        (["ping", "--payload", "[1, 2]"], "JSON object"),
        (["sleep", "--payload", '{"seconds": "x"}'], "payload.seconds"),
        (["ping", "--priority", "500"], "priority"),
        (["ping", "--run-after", "tomorrow"], "--run-after"),
        (["ping", "--run-after", "2030-01-01T00:00:00"], "run_after"),
        (["ping", "--parent", "not-a-uuid"], "parent"),
    ],
)
def test_cli_refuses_bad_input_with_a_clear_message(args, expected):
    before = stored()
    with pytest.raises(CommandError) as info:
        run_enqueue(*args)
    assert expected in str(info.value)
    assert stored() == before


# --- atomicity ----------------------------------------------------------------------


@pytest.fixture
def refused_queue(transactional_db):
    """Make the database refuse any job INSERTed on the queue ``atomic-refused``.

    Outside any test transaction (``transactional_db``): inside one, the
    test's own transaction would hide a half-done enqueue. Enqueue writes no
    event row any more (``jobs.timeline``), so the failure is injected into
    the job INSERT itself, on the batch's last row.
    """
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "CREATE FUNCTION test_refuse_job() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'job insert refused by the test'; END; $$"
            )
            cursor.execute(
                "CREATE TRIGGER test_refuse_job BEFORE INSERT ON controlplane_job "
                "FOR EACH ROW WHEN (NEW.queue = 'atomic-refused') "
                "EXECUTE FUNCTION test_refuse_job()"
            )
        else:
            cursor.execute(
                "CREATE TRIGGER test_refuse_job BEFORE INSERT ON controlplane_job "
                "WHEN NEW.queue = 'atomic-refused' "
                "BEGIN SELECT RAISE(ABORT, 'job insert refused by the test'); END"
            )
    yield
    with connection.cursor() as cursor:
        cursor.execute(
            "DROP TRIGGER test_refuse_job"
            + (" ON controlplane_job" if connection.vendor == "postgresql" else "")
        )
        if connection.vendor == "postgresql":
            cursor.execute("DROP FUNCTION test_refuse_job()")


@pytest.mark.parametrize("count", [3, 2500])
def test_a_refused_job_insert_leaves_no_job_of_the_batch(refused_queue, count):
    """A batch is stored whole or not at all: at 2,500 jobs the refused row is in the
    third 1,000-job statement, after two were inserted in the same transaction."""
    from django.db import DatabaseError

    specs = [JobSpec("ping", queue="atomic") for _ in range(count - 1)]
    with pytest.raises(DatabaseError, match="refused by the test"):
        enqueue_many([*specs, JobSpec("ping", queue="atomic-refused")])
    assert Job.objects.filter(queue__startswith="atomic").count() == 0
    assert enqueue_many(specs) and Job.objects.filter(queue="atomic").count() == count - 1


# --- payloads no database can store ---------------------------------------------------


@pytest.mark.parametrize(
    "payload,field,words",
    [
        ({"x": float("nan")}, "payload.x", "nan"),
        ({"x": float("inf")}, "payload.x", "inf"),
        ({"x": -float("inf")}, "payload.x", "inf"),
        ({"x": 1e400}, "payload.x", "inf"),
        ({"a": {"b": [1, float("nan")]}}, "payload.a.b.1", "finite"),
        ({"s": "a\x00b"}, "payload.s", "NUL"),
        ({"a": ["ok", {"s": "\x00"}]}, "payload.a.1.s", "NUL"),
        ({"k\x00": 1}, "payload.'k\\x00'", "NUL"),
        ({"s": "\ud800"}, "payload.s", "surrogate"),
        ({"s": "x\udfff"}, "payload.s", "surrogate"),
        ({"\udc80": 1}, "payload.'\\udc80'", "surrogate"),
    ],
)
def test_unstorable_payloads_are_refused_with_the_field(payload, field, words):
    before = stored()
    with pytest.raises(EnqueueError) as info:
        enqueue("ping", payload)
    assert field in info.value.errors, info.value.errors
    assert words in " ".join(info.value.errors[field])
    assert stored() == before


def test_an_escaped_backslash_u0000_is_an_ordinary_string():
    """The text ``\\u0000`` (backslash, u, zeros) is storable: only a real NUL is refused."""
    message = "\\u0000 é \U0001f600"
    job = enqueue("fail", {"message": message})
    assert fresh(job).payload == {"message": message}


def test_an_unstorable_payload_in_a_batch_stores_nothing():
    before = stored()
    with pytest.raises(EnqueueError) as info:
        enqueue_many([JobSpec("ping", {}), JobSpec("ping", {"n": float("nan")})])
    assert list(info.value.errors) == ["1.payload.n"]
    assert stored() == before


@pytest.mark.parametrize(
    "options,field",
    [
        ({"queue": "q\x00"}, "queue"),
        ({"queue": "q\ud800"}, "queue"),
        ({"idempotency_key": "k\x00"}, "idempotency_key"),
        ({"idempotency_key": "k\udfff"}, "idempotency_key"),
    ],
)
def test_unstorable_queue_names_and_keys_are_refused(options, field):
    before = stored()
    with pytest.raises(EnqueueError) as info:
        enqueue("ping", {}, **options)
    assert list(info.value.errors) == [field]
    assert stored() == before


@pytest.mark.parametrize(
    "payload,expected",
    [
        ('{"x": NaN}', "payload.x"),
        ('{"x": Infinity}', "payload.x"),
        ('{"x": 1e400}', "payload.x"),
        ('{"x": "a\\u0000b"}', "NUL"),
        ('{"x": "\\ud800"}', "surrogate"),
    ],
)
def test_cli_refuses_unstorable_payloads(payload, expected):
    before = stored()
    with pytest.raises(CommandError) as info:
        run_enqueue("ping", "--payload", payload)
    assert expected in str(info.value)
    assert stored() == before


@pytest.mark.parametrize(
    "body",
    [
        '{"operation": "ping", "payload": {"x": 1e400}}',
        '{"operation": "ping", "payload": {"x": "a\\u0000b"}}',
        '{"operation": "ping", "payload": {"x": "\\udc80"}}',
    ],
)
def test_rest_refuses_unstorable_payloads(client, body):
    from django.contrib.auth.models import User
    from rest_framework.authtoken.models import Token

    token = Token.objects.create(user=User.objects.create_superuser("enq-admin", None, None))
    before = stored()
    response = client.post(
        "/jobs",
        data=body,
        content_type="application/json",
        headers={"Authorization": f"Token {token.key}"},
    )
    assert response.status_code == 400, response.content
    # The API's own parser may refuse it first, under "payload"; either way a field error.
    assert any(name.startswith("payload") for name in response.json()["errors"]), response.json()
    assert stored() == before
