"""``manage.py jobs pause|resume``: queues paused from a shell, audited like the API's."""

from __future__ import annotations

import pytest

from jobs.models import OperatorAction, Queue

pytestmark = pytest.mark.django_db


def test_pause_and_resume_go_through_the_audited_service(jobs) -> None:
    run = jobs("pause", "billing", "mail", "--by", "alice")
    assert run.code == 0, run.err
    assert run.out.splitlines() == ["Paused queue billing.", "Paused queue mail."]
    assert set(Queue.objects.filter(paused=True).values_list("name", flat=True)) == {
        "billing",
        "mail",
    }

    run = jobs("resume", "billing", "--by", "alice")
    assert run.code == 0, run.err
    assert not Queue.objects.get(name="billing").paused
    assert Queue.objects.get(name="mail").paused
    audited = list(
        OperatorAction.objects.order_by("at", "id").values_list("username", "action", "target")
    )
    assert audited == [
        ("alice", "pause", "billing"),
        ("alice", "pause", "mail"),
        ("alice", "resume", "billing"),
    ]


def test_a_bad_queue_name_is_a_usage_error_and_changes_nothing(jobs) -> None:
    run = jobs("pause", "   ")
    assert run.code == 2
    assert "queue name" in run.err
    assert not Queue.objects.exists() and not OperatorAction.objects.exists()
