"""Queues on two real databases: producers route by queue, each shard's workers run its jobs."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, connections
from django.test import override_settings

from jobs import timeline
from jobs.enqueue import JobSpec, enqueue
from jobs.models import Job, JobEvent
from jobs.shards import QueueShards
from jobs.transitions import emit_event
from tests.conftest import FAST_KNOBS, ROOT, database_url_for_subprocess, wait_for

SHARD = "shard2"
# The shard is a database of the test case too: flushed after each test like ``default``.
pytestmark = pytest.mark.django_db(transaction=True, databases=["default", SHARD])


@pytest.fixture(scope="module", autouse=True)
def shard(django_db_setup, django_db_blocker) -> Iterator[str]:
    """A second database, migrated by ``manage.py migrate`` and registered as alias ``shard2``
    before the test case is built (module scope: set up once, ahead of the per-test database
    fixtures); yields its URL for the shard's worker processes. Dropped at teardown."""
    with django_db_blocker.unblock():
        base = connection.settings_dict
        postgres = connection.vendor == "postgresql"
        if postgres:
            name = f"{base['NAME']}_{SHARD}"
            with connection._nodb_cursor() as cursor:
                cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                cursor.execute(f'CREATE DATABASE "{name}"')
            url = database_url_for_subprocess().rsplit("/", 1)[0] + f"/{name}"
        else:
            name = str(Path(base["NAME"]).resolve().with_name(f"{SHARD}.sqlite3"))
            Path(name).unlink(missing_ok=True)
            url = f"sqlite:///{name}"
    env = {**os.environ, **FAST_KNOBS, "DATABASE_URL": url}
    env.pop("CONTROLPLANE_TEST_DB_NAME", None)
    migrate = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "migrate", "--no-input", "-v", "0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert migrate.returncode == 0, migrate.stdout + migrate.stderr
    settings.DATABASES[SHARD] = {**copy.deepcopy(base), "NAME": name}  # also connections.settings
    try:
        yield url
    finally:
        with django_db_blocker.unblock():
            connections[SHARD].close()
            del connections[SHARD]
            del settings.DATABASES[SHARD]
            if postgres:
                with connection._nodb_cursor() as cursor:
                    cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            else:
                Path(name).unlink(missing_ok=True)


def on(alias: str, job: Job) -> Job | None:
    return Job.objects.using(alias).filter(pk=job.pk).first()


def test_enqueue_stores_each_job_on_its_queues_shard(shard):
    shards = QueueShards({"emails": SHARD})

    mail = shards.enqueue("ping", {}, queue="emails")
    other = shards.enqueue("ping", {}, queue="reports")
    by_operation = shards.enqueue("ping")  # no queue: the operation's own ("default")

    assert on(SHARD, mail) is not None and on("default", mail) is None
    assert mail._state.db == SHARD
    for job in (other, by_operation):
        assert on("default", job) is not None and on(SHARD, job) is None
    # Each job's timeline lives on its own shard: job.enqueued is implied by the shard's job
    # row (jobs.timeline), nothing is stored on either database, and the next event is seq 2
    # there.
    assert on(SHARD, mail).last_event_seq == 1
    assert not JobEvent.objects.using(SHARD).exists()
    assert not JobEvent.objects.using("default").exists()
    assert emit_event(mail.pk, event="t.next", using=SHARD) == 2
    stored = list(mail.events.using(SHARD).order_by("seq"))
    page = timeline.complete(stored, job_id=mail.pk, created_at=on(SHARD, mail).created_at)
    assert [(e.seq, e.event) for e in page] == [(1, "job.enqueued"), (2, "t.next")]
    assert not JobEvent.objects.using("default").exists()


def test_enqueue_many_splits_by_shard_and_keeps_the_order(shard):
    shards = QueueShards({"emails": SHARD})
    specs = [JobSpec("ping", {}, queue=q) for q in ("emails", "default", "emails", "reports")]

    jobs = shards.enqueue_many(specs)

    assert [j.queue for j in jobs] == ["emails", "default", "emails", "reports"]
    assert [j._state.db for j in jobs] == [SHARD, "default", SHARD, "default"]
    assert Job.objects.using(SHARD).count() == 2
    assert Job.objects.using("default").count() == 2
    assert shards.find_job(jobs[0].pk) == jobs[0]
    assert shards.find_job(jobs[1].pk)._state.db == "default"


def test_a_shards_worker_runs_its_queue_and_never_sees_another_database(shard, start_process):
    shards = QueueShards({"emails": SHARD})
    routed = shards.enqueue("ping", {}, queue="emails")
    # The same queue name on the default database: a misrouted job the shard's worker must not see.
    stray = enqueue("ping", {}, queue="emails")

    worker = start_process("runworker", "--queue", "emails", "--burst", env={"DATABASE_URL": shard})

    assert worker.wait(timeout=120) == 0, worker.output()
    done = on(SHARD, routed)
    assert done.status == "succeeded" and done.result == {"pong": True}
    assert on("default", stray).status == "queued"


def test_a_worker_on_the_default_database_leaves_the_shard_alone(shard, start_process):
    shards = QueueShards({"emails": SHARD})
    routed = shards.enqueue("ping", {}, queue="emails")
    local = shards.enqueue("ping", {}, queue="reports")

    worker = start_process("runworker", "--queue", "emails", "--queue", "reports", "--burst")

    assert worker.wait(timeout=120) == 0, worker.output()
    wait_for(lambda: on("default", local).status == "succeeded", message="the local job")
    assert on(SHARD, routed).status == "queued"


def test_an_alias_missing_from_databases_is_a_clear_error():
    with pytest.raises(ImproperlyConfigured, match="nowhere"):
        QueueShards({"emails": "nowhere"})


def test_the_map_comes_from_settings(shard):
    configured = {**getattr(settings, "CONTROLPLANE", {}), "QUEUE_SHARDS": {"emails": SHARD}}
    with override_settings(CONTROLPLANE=configured):
        shards = QueueShards.from_settings()
    assert shards.alias_for("emails") == SHARD
    assert shards.alias_for("anything else") == "default"
    assert shards.aliases == ["default", SHARD]
