"""A database of the old ``jobs_*`` layout moves to the ``controlplane`` label with its data."""

from __future__ import annotations

import io
import uuid

import pytest
from django.apps import apps
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.db import connection

from jobs.claims import claim_jobs
from jobs.enqueue import enqueue
from jobs.models import Job, JobEvent
from jobs.relabel import has_legacy_tables, refuse_legacy_tables
from jobs.transitions import emit_event
from tests.integration.timelines import timeline_of

pytestmark = pytest.mark.django_db(transaction=True)


def _back_to_the_old_layout() -> None:
    """What a database made before the relabel looks like (the inverse of ``relabel``)."""
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "DROP TRIGGER controlplane_jobevent_notify ON controlplane_jobevent; "
                "DROP FUNCTION controlplane_jobevent_notify(); "
                "DROP FUNCTION controlplane_claimable_ids"
                "(text[], timestamptz, int, text[], text[]);"
            )
        for model in apps.get_app_config("controlplane").get_models():
            old = f"jobs_{model._meta.model_name}"
            cursor.execute(f"ALTER TABLE {quote(model._meta.db_table)} RENAME TO {quote(old)}")
        cursor.execute("UPDATE django_migrations SET app = 'jobs' WHERE app = 'controlplane'")
        cursor.execute(
            "UPDATE django_content_type SET app_label = 'jobs' WHERE app_label = 'controlplane'"
        )


class _Editor:
    def __init__(self) -> None:
        self.connection = connection


def test_relabel_keeps_jobs_events_grants_and_the_claim():
    alice = User.objects.create_user("alice")
    alice.user_permissions.add(Permission.objects.get(codename="view_job"))
    job = enqueue("ping", {})
    emit_event(job.pk, event="t.kept")  # a stored event (job.enqueued is implied, not stored)
    assert not has_legacy_tables(connection)

    _back_to_the_old_layout()
    try:
        assert has_legacy_tables(connection)
        with pytest.raises(RuntimeError, match="controlplane_relabel"):
            refuse_legacy_tables(None, _Editor())
        call_command("controlplane_relabel", stdout=(out := io.StringIO()))
        assert "Renamed" in out.getvalue() and "controlplane_jobevent" in out.getvalue()
    finally:
        call_command(
            "controlplane_relabel", stdout=io.StringIO()
        )  # never leave the old layout behind

    assert not has_legacy_tables(connection)
    assert Job.objects.get(pk=job.id).operation == "ping"
    assert list(JobEvent.objects.filter(job_id=job.id).values_list("seq", "event")) == [
        (2, "t.kept")
    ]
    assert timeline_of(job) == [(1, "job.enqueued"), (2, "t.kept")]
    assert User.objects.get(username="alice").has_perm("controlplane.view_job")
    call_command("migrate", check=True, verbosity=0)  # exits non-zero if anything is unapplied
    claimed = claim_jobs(queues=[job.queue], worker_id=uuid.uuid4(), limit=1, lease_seconds=30)
    assert [c.id for c in claimed] == [job.id]

    call_command("controlplane_relabel", stdout=(again := io.StringIO()))
    assert "Nothing to rename" in again.getvalue()
