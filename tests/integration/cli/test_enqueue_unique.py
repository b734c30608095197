"""``manage.py enqueue`` with ``--unique-key``/``--unique-while``, ``--timeout-seconds`` and
``--retry``."""

from __future__ import annotations

import uuid
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_controlplane.testing import assert_enqueued, refute_enqueued
from tests.factories import fresh

pytestmark = pytest.mark.django_db


def enqueue_cli(*args: str) -> tuple[str, str]:
    """What ``manage.py enqueue`` printed: (stdout, stderr)."""
    out, err = StringIO(), StringIO()
    call_command("enqueue", *args, stdout=out, stderr=err)
    return out.getvalue().strip(), err.getvalue().strip()


def test_a_repeated_key_prints_the_holders_id_and_says_duplicate_on_stderr():
    first, quiet = enqueue_cli("ping", "--unique-key", "nightly", "--unique-while", "queued")
    assert quiet == ""
    [job] = assert_enqueued("ping", count=1)
    assert (str(job.pk), job.unique_key, job.unique_while) == (first, "nightly", "queued")
    again, said = enqueue_cli("ping", "--unique-key", "nightly", "--unique-while", "queued")
    assert again == first
    assert said.startswith("duplicate:") and first in said and "nothing was enqueued" in said
    assert [str(j.pk) for j in assert_enqueued("ping", count=1)] == [first]


def test_idempotency_key_still_works_as_a_key_held_until_retention():
    first, _ = enqueue_cli("ping", "--idempotency-key", "order-1")
    again, said = enqueue_cli(
        "ping", "--unique-key", "order-1", "--unique-while", "until_retention"
    )
    assert again == first and said.startswith("duplicate:")
    assert fresh(uuid.UUID(first)).unique_while == "until_retention"


def test_timeout_seconds_is_stored():
    printed, _ = enqueue_cli("ping", "--timeout-seconds", "2.5")
    assert fresh(uuid.UUID(printed)).timeout_seconds == 2.5


def test_a_retry_override_is_stored():
    printed, _ = enqueue_cli("ping", "--retry", '{"backoff_seconds": 5, "strategy": "linear"}')
    assert fresh(uuid.UUID(printed)).retry_policy == {"backoff_seconds": 5, "strategy": "linear"}


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--retry", "{not json"], "--retry is not valid JSON"),
        (["--retry", '{"jitter": 2}'], "jitter must be a fraction"),
        (["--unique-key", "k", "--unique-while", "forever"], "unique_while"),
        (["--unique-while", "active"], "unique_while needs a unique_key"),
        (["--timeout-seconds", "0"], "timeout_seconds"),
        (["--timeout-seconds", "nan"], "timeout_seconds"),
        (["--timeout-seconds", "soon"], "timeout_seconds"),
        (["--unique-key", "k", "--idempotency-key", "k"], "not both"),
    ],
)
def test_bad_options_are_refused_with_a_clear_message(args, expected):
    with pytest.raises(CommandError) as info:
        enqueue_cli("ping", *args)
    assert expected.replace("_", "-") in str(info.value) or expected in str(info.value)
    refute_enqueued()
