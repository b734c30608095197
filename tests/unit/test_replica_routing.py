"""Where reads go with and without a replica, the sticky-primary cookie, the router's rules
(no database: the real replica is in tests/integration/replica)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import dj_database_url
import pytest
from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpResponse
from django.test import RequestFactory

from django_controlplane import configure
from jobs import replica
from jobs.replica import REPLICA, STICKY_COOKIE, ReplicaRouter, StickyPrimaryMiddleware

pytestmark = pytest.mark.skipif(replica.configured(), reason="DATABASE_REPLICA_URL is set")


def from_db(alias: str) -> SimpleNamespace:
    """Something that looks like a model instance loaded from ``alias``."""
    return SimpleNamespace(_state=SimpleNamespace(db=alias))


def test_without_a_replica_everything_reads_the_primary() -> None:
    assert replica.choose_alias(RequestFactory().get("/jobs")) == "default"
    assert replica.on_replica(lambda: "called") == "called"
    assert replica.read_alias() == "default"
    assert not getattr(settings, "DATABASE_ROUTERS", [])
    assert "jobs.replica.StickyPrimaryMiddleware" not in settings.MIDDLEWARE


def test_a_write_pins_the_client_to_the_primary_for_a_while(settings) -> None:
    settings.CONTROLPLANE = {"REPLICA_STICKY_SECONDS": 5.0}
    middleware = StickyPrimaryMiddleware(lambda request: HttpResponse("ok"))
    factory = RequestFactory()
    assert STICKY_COOKIE not in middleware(factory.get("/dashboard/jobs/")).cookies
    before = time.time()
    cookie = middleware(factory.post("/jobs/x/cancel")).cookies[STICKY_COOKIE]
    assert before + 4.999 <= float(cookie.value) <= time.time() + 5.001
    assert cookie["max-age"] == 5 and cookie["httponly"]

    pinned = factory.get("/dashboard/jobs/x/")
    pinned.COOKIES[STICKY_COOKIE] = cookie.value
    assert replica.primary_pinned(pinned)
    for value in (f"{time.time() - 1}", "not a number", ""):
        request = factory.get("/")
        request.COOKIES[STICKY_COOKIE] = value
        assert not replica.primary_pinned(request)
    assert not replica.primary_pinned(None)

    settings.CONTROLPLANE = {"REPLICA_STICKY_SECONDS": 0.0}
    assert STICKY_COOKIE not in middleware(factory.post("/jobs/x/cancel")).cookies


def test_the_sticky_middleware_stays_async_for_async_views(settings) -> None:
    """A parked long-poll (an async view) must not hold a thread for it."""

    async def view(request):
        return HttpResponse("ok")

    settings.CONTROLPLANE = {"REPLICA_STICKY_SECONDS": 5.0}
    middleware = StickyPrimaryMiddleware(view)
    assert iscoroutinefunction(middleware)
    response = asyncio.run(middleware(RequestFactory().post("/workers/x/claim")))
    assert STICKY_COOKIE in response.cookies


def test_the_router_reads_the_replica_only_inside_a_scope_and_until_a_write() -> None:
    router = ReplicaRouter()
    assert router.db_for_read(object) is None  # outside: the primary, as without a router
    assert router.db_for_read(object, instance=from_db(REPLICA)) == "default"
    assert router.db_for_write(object, instance=from_db(REPLICA)) == "default"
    with replica.reading(REPLICA):
        assert router.db_for_read(object) == REPLICA
        assert replica.read_alias() == REPLICA
        assert router.db_for_write(object) == "default"
        assert router.db_for_read(object) is None  # read after write: the primary
    with replica.reading("default"):  # a scope the replica could not serve
        assert router.db_for_read(object) is None
    assert router.allow_migrate(REPLICA, "controlplane") is False
    assert router.allow_migrate("default", "controlplane") is None
    assert router.allow_relation(from_db(REPLICA), from_db("default")) is True


def test_the_replica_alias_copies_the_primary_and_is_never_a_test_database() -> None:
    replica_config = dict(dj_database_url.parse("postgres://reader@replica.internal:5433/cp"))
    sqlite = {"DATABASES": {"default": {"ENGINE": "django.db.backends.sqlite3"}}}
    with pytest.raises(ImproperlyConfigured, match="needs a PostgreSQL 'default'"):
        configure({**sqlite, "DATABASES": {**sqlite["DATABASES"], "replica": replica_config}})
    primary = dict(dj_database_url.parse("postgres://writer@primary.internal/cp"))
    settings = {"DATABASES": {"default": primary, "replica": replica_config}, "MIDDLEWARE": []}
    configure(settings)
    config = settings["DATABASES"]["replica"]
    assert (config["HOST"], config["PORT"], config["USER"]) == ("replica.internal", 5433, "reader")
    assert config["TEST"] == {"MIRROR": "default"}
    assert config["OPTIONS"]["connect_timeout"] == 2
    assert settings["DATABASE_ROUTERS"] == ["jobs.replica.ReplicaRouter"]
    assert settings["MIDDLEWARE"][-1] == "jobs.replica.StickyPrimaryMiddleware"


def test_while_one_thread_measures_the_others_keep_the_last_measure() -> None:
    replica.forget()
    try:
        with replica._health_lock:  # another thread is measuring
            assert replica.health().lag is None  # nothing known yet: the primary
            replica._health = old = replica.Health(time.monotonic() - 3600, 0.5)
            assert replica.health() is old  # out of date, but nobody waits for the measure
    finally:
        replica.forget()
