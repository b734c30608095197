"""The built wheel, installed into a stranger's Django project, does what README.md promises.

A wheel is built from the checkout and its contents checked; then a fresh
virtualenv gets it (not editable), ``startproject mysite`` + ``startapp
billing`` make a host project edited with README.md's lines, ``billing``
defines an operation over a model of its own, and the host migrates, enqueues,
runs ``runworker --burst`` and serves the dashboard, the API and the WebSocket
under ``/ops/`` with uvicorn. Both on SQLite and on PostgreSQL.

This builds and installs once per run, so it runs in one pass of
``./scripts/dev test`` only: the SQLite pass (where ``DATABASE_URL`` is not
PostgreSQL), which also runs for a plain ``pytest``. It makes its own
databases, so the pass's database does not matter; the PostgreSQL variant uses
the server of ``CONTROLPLANE_TEST_POSTGRES_URL`` (the one ./scripts/dev uses).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.integration.installed.host_project import (
    HOST_REST_FRAMEWORK,
    ROOT,
    HostProject,
    Server,
    run,
    wheel_metadata,
    wheel_names,
)

pytestmark = pytest.mark.skipif(
    os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")),
    reason="packaging runs once per ./scripts/dev test, in the SQLite pass (both databases)",
)

PACKAGES = ("controlplane", "dashboard", "jobs", "workers")
PASSWORD = "a-long-test-password-9"

# Run by the host's ``manage.py shell``: what the worker left behind, as JSON.
READ_STATE = """\
import json, os
from django.conf import settings
from billing.models import Invoice
from jobs.models import Job
from jobs.selectors import job_events_after

def seen(job):
    return [event.event for event in job_events_after(job.pk)]

jobs = [Job.objects.get(pk=pk) for pk in os.environ["JOB_IDS"].split()]
print(json.dumps({
    "paid": [i.paid for i in Invoice.objects.order_by("pk")],
    "jobs": [[j.queue, j.status, j.result, seen(j)] for j in jobs],
    "rest_framework": settings.REST_FRAMEWORK,
}))
"""


def test_wheel_holds_the_code_migrations_templates_and_static_files(wheel: Path) -> None:
    names = wheel_names(wheel)

    def shipped(pattern: str) -> set[str]:
        """The checkout's files that match: each must be in the wheel."""
        return {p.relative_to(ROOT).as_posix() for p in ROOT.glob(pattern) if p.is_file()}

    migrations = shipped("jobs/migrations/*.py")
    templates = shipped("dashboard/templates/dashboard/*.html")
    static = shipped("dashboard/static/dashboard/**/*")
    modules = {m for package in PACKAGES for m in shipped(f"{package}/**/*.py")}
    assert "jobs/migrations/0001_initial.py" in migrations
    assert "dashboard/templates/dashboard/base.html" in templates
    assert {"dashboard/static/dashboard/app.css", "dashboard/static/dashboard/live.js"} <= static
    assert any(
        re.fullmatch(r"dashboard/static/dashboard/vendor/htmx-[\d.]+\.min\.js", s) for s in static
    )
    for group in (migrations, templates, static, modules):
        assert group - names == set(), f"missing from {wheel.name}: {sorted(group - names)}"

    top_level = {name.split("/", 1)[0] for name in names}
    others = top_level - set(PACKAGES)
    assert len(others) == 1 and others.pop().endswith(".dist-info"), sorted(top_level)
    assert not [n for n in names if n.startswith("tests/") or "/tests/" in n]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]

    metadata = wheel_metadata(wheel)
    assert "Name: django-controlplane" in metadata
    assert re.search(r"^Requires-Dist: Django>=6", metadata, flags=re.MULTILINE)


# Its first run also makes the virtualenv: on a cold pip cache that alone can take minutes.
@pytest.mark.timeout(420)
def test_host_project_runs_the_installed_control_plane(
    host_project: HostProject, tmp_path: Path
) -> None:
    project = host_project
    site_packages = project.venv.site_packages

    # What runs is the wheel in the fresh venv and the host's own billing app.
    where = json.loads(
        run(
            [
                project.venv.python,
                "-c",
                "import json, jobs, billing; print(json.dumps([jobs.__file__, billing.__file__]))",
            ],
            cwd=project.root,
            env=project.env(),
        )
    )
    assert Path(where[0]).is_relative_to(site_packages), where
    assert Path(where[1]).is_relative_to(project.root), where
    assert not Path(where[0]).is_relative_to(ROOT)

    project.manage("makemigrations", "billing")
    project.manage("migrate", "--noinput")
    made = project.shell_json(
        "import json\n"
        "from billing.models import Invoice\n"
        "ids = [Invoice.objects.create(number=n, total='12.50').pk for n in ('F-1', 'F-2')]\n"
        "print(json.dumps(ids))"
    )
    job_ids = [
        project.manage(
            "enqueue", "billing.mark_paid", "--payload", json.dumps({"invoice": pk})
        ).strip()
        for pk in made
    ]
    project.manage("runworker", "--queue", "billing", "--burst", timeout=60)

    state = project.shell_json(READ_STATE, JOB_IDS=" ".join(job_ids))
    assert state["paid"] == [True, True]
    for (queue, status, result, events), number in zip(state["jobs"], ("F-1", "F-2"), strict=True):
        assert (queue, status, result) == (
            "billing",
            "succeeded",
            {"number": number, "total": "12.50"},
        )
        assert {"job.enqueued", "job.started", "billing.paid", "job.succeeded"} <= set(events)
    assert state["rest_framework"] == HOST_REST_FRAMEWORK  # ours never touches the host's

    # The static files travel in the wheel and the host's finders see them.
    found = project.manage("findstatic", "dashboard/app.css", "--verbosity", "0").strip()
    assert Path(found).is_relative_to(site_packages), found

    project.manage(
        "createsuperuser",
        "--noinput",
        "--username",
        "owner",
        "--email",
        "owner@example.com",
        DJANGO_SUPERUSER_PASSWORD=PASSWORD,
    )
    token = re.search(r"Generated token (\w+)", project.manage("drf_create_token", "owner"))
    assert token, "drf_create_token printed no token"

    server = Server(project, tmp_path / "uvicorn.log")
    try:
        server.wait_ready()
        check_api(server.url, token.group(1), job_ids)
        session = check_dashboard(server.url, job_ids)
        check_websocket(server.url, session)
    except BaseException:
        print(server.output())
        raise
    finally:
        server.stop()


def check_api(url: str, token: str, job_ids: list[str]) -> None:
    """The REST API under /ops/: token auth and JSON despite the host's DRF defaults."""
    with httpx.Client(base_url=url, timeout=10, headers={"Authorization": f"Token {token}"}) as api:
        listed = api.get("/ops/jobs", params={"limit": 1})
        assert listed.status_code == 200, listed.text
        assert listed.headers["content-type"].startswith("application/json")
        body = listed.json()
        assert [j["id"] for j in body["results"]] == [job_ids[1]]  # newest first
        assert urlsplit(body["next"]).path == "/ops/jobs", body["next"]
        rest = api.get(body["next"]).json()
        assert [(j["id"], j["status"]) for j in rest["results"]] == [(job_ids[0], "succeeded")]

        one = api.get(f"/ops/jobs/{job_ids[0]}")
        assert one.json()["operation"] == "billing.mark_paid"

        schema = api.get("/ops/schema")
        assert schema.status_code == 200, schema.text
        paths = json.loads(schema.text)["paths"]
        assert "/ops/jobs" in paths and "/ops/queues" in paths
        assert all(p.startswith("/ops/") for p in paths), sorted(paths)

        unknown = api.get("/ops/jobs/x/y/z")
        assert unknown.status_code == 404
        assert unknown.headers["content-type"].startswith("application/json")
        assert "message" in unknown.json()

    anonymous = httpx.get(f"{url}/ops/jobs", timeout=10)
    assert anonymous.status_code in (401, 403), anonymous.text
    assert "message" in anonymous.json()


def check_dashboard(url: str, job_ids: list[str]) -> str:
    """The dashboard under /ops/, signed in through the host's own login; the session id."""
    with httpx.Client(base_url=url, timeout=10) as browser:
        root = browser.get("/ops/")
        assert (root.status_code, root.headers["location"]) == (302, "/ops/dashboard/")
        anonymous = browser.get("/ops/dashboard/")
        assert anonymous.status_code == 302
        assert anonymous.headers["location"] == "/accounts/login/?next=/ops/dashboard/"

        form = browser.get("/admin/login/")
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
        assert csrf, form.text
        login = browser.post(
            "/admin/login/",
            data={
                "username": "owner",
                "password": PASSWORD,
                "csrfmiddlewaretoken": csrf.group(1),
                "next": "/ops/dashboard/",
            },
        )
        assert (login.status_code, login.headers.get("location")) == (302, "/ops/dashboard/")

        overview = browser.get("/ops/dashboard/")
        assert overview.status_code == 200, overview.text
        assert 'href="/ops/dashboard/jobs/"' in overview.text
        assert 'data-ws="/ops/ws/dashboard/"' in overview.text
        assert 'href="/static/dashboard/app.css"' in overview.text

        jobs = browser.get("/ops/dashboard/jobs/")
        assert jobs.status_code == 200
        for job_id in job_ids:
            assert f'href="/ops/dashboard/jobs/{job_id}/"' in jobs.text

        detail = browser.get(f"/ops/dashboard/jobs/{job_ids[0]}/")
        assert detail.status_code == 200
        assert "invoice F-1 paid" in detail.text
        return browser.cookies["sessionid"]


def check_websocket(url: str, session: str) -> None:
    """The live socket answers at /ops/ws/dashboard/ for the signed-in user, and only for them."""
    ws_url = url.replace("http://", "ws://") + "/ops/ws/dashboard/"
    with connect(
        ws_url, origin=url, additional_headers={"Cookie": f"sessionid={session}"}, open_timeout=10
    ):
        pass
    with pytest.raises(InvalidStatus):  # no session: refused before the handshake completes
        with connect(ws_url, origin=url, open_timeout=10):
            pass
