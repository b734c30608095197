"""``manage.py enqueue --key`` (repeatable): the job's flow keys, and bad keys refused."""

from __future__ import annotations

import subprocess
import sys
import uuid
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_controlplane.testing import refute_enqueued
from jobs.models import Job
from tests.conftest import ROOT
from tests.factories import fresh


def enqueue_cli(*args: str) -> str:
    """What ``manage.py enqueue`` printed on stdout: the new job's id."""
    out = StringIO()
    call_command("enqueue", *args, stdout=out, stderr=StringIO())
    return out.getvalue().strip()


@pytest.mark.django_db
def test_each_key_option_adds_a_key_in_order():
    printed = enqueue_cli("ping", "--key", "account:42", "--key", "api:7", "--key", "account:42")
    job = fresh(uuid.UUID(printed))
    assert (job.flow_keys, job.fair_key) == (["account:42", "api:7"], "account:42")


@pytest.mark.django_db
def test_a_key_may_be_a_template_filled_from_the_payload():
    printed = enqueue_cli("sleep", "--payload", '{"seconds": 0}', "--key", "op:{operation}")
    assert fresh(uuid.UUID(printed)).flow_keys == ["op:sleep"]


@pytest.mark.django_db
def test_without_a_key_the_job_has_none():
    assert fresh(uuid.UUID(enqueue_cli("ping"))).flow_keys is None


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ([""], "must be a non-empty string"),
        ([":42"], "must not start with ':'"),
        (["a\x00b"], "NUL"),
        (["k" * 201], "longer than"),
        (["account:{account_id}"], "which the payload lacks"),
        ([f"k:{i}" for i in range(9)], "at most 8 keys"),
    ],
)
def test_bad_keys_are_refused_with_a_clear_message(keys, expected):
    args = [arg for key in keys for arg in ("--key", key)]
    with pytest.raises(CommandError) as info:
        enqueue_cli("ping", *args)
    assert "keys:" in str(info.value) and expected in str(info.value)
    refute_enqueued()


@pytest.mark.django_db(transaction=True)
def test_a_real_process_prints_the_id_or_exits_non_zero(subprocess_env):
    def manage(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), "enqueue", "ping", *args],
            cwd=ROOT,
            env=subprocess_env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    made = manage("--key", "account:42", "--key", "api:7")
    assert made.returncode == 0, made.stderr
    assert Job.objects.get(pk=made.stdout.strip()).flow_keys == ["account:42", "api:7"]
    refused = manage("--key", ":42")
    assert refused.returncode == 1, (refused.stdout, refused.stderr)
    assert "must not start with ':'" in refused.stderr and "Traceback" not in refused.stderr
    assert Job.objects.count() == 1
