"""The built wheel, installed into a stranger's Django project, does what README.md promises.

A wheel is built from the checkout and its contents checked; then a fresh
virtualenv gets it (not editable), ``startproject mysite`` + ``startapp
billing`` make a host project edited with README.md's lines (read from the
README itself), ``billing`` defines an operation over a model of its own, and
the host runs the README's commands as a person would: ``migrate``,
``grant_role … --create``, ``manage.py serve``, ``runworker`` and ``reaper`` as
long-running processes. Then the REST API, ``/metrics``, a remote worker, the
WebSocket and, in a real browser, the operator's sign-in, the styled live
dashboard under ``/ops/`` and a cancel. Both on SQLite and on PostgreSQL.

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
import shutil
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.integration.installed.host_browser import check_browser
from tests.integration.installed.host_project import (
    HOST_REST_FRAMEWORK,
    ROOT,
    Background,
    HostProject,
    Server,
    readme_commands,
    run,
    wheel_metadata,
    wheel_names,
)

pytestmark = pytest.mark.skipif(
    os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")),
    reason="packaging runs once per ./scripts/dev test, in the SQLite pass (both databases)",
)

PACKAGES = ("django_controlplane", "dashboard", "jobs", "workers")
# What the README's run block does, in its order (each line is run as written).
README_COMMANDS = ["migrate", "grant_role", "serve", "runworker", "reaper"]
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
    # The repository's own deployment is a host project, not part of what a host installs.
    assert not [n for n in names if n.startswith(("controlplane/", "templates/"))]

    metadata = wheel_metadata(wheel)
    assert "Name: django-controlplane" in metadata
    assert re.search(r"^Requires-Dist: Django>=6", metadata, flags=re.MULTILINE)


# Its first run also makes the virtualenv: on a cold pip cache that alone can take minutes.
@pytest.mark.timeout(600)
def test_host_project_runs_the_readme_recipe(host_project: HostProject, tmp_path: Path) -> None:
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

    commands = readme_commands()
    assert [c[0] for c in commands] == README_COMMANDS, commands
    migrate, grant_role, serve, runworker, reaper = commands
    operator = grant_role[1]
    password = grant_role[grant_role.index("--password") + 1]

    assert "no issues" in project.manage("check")
    project.manage("makemigrations", "billing")
    project.manage(*migrate, "--noinput")
    project.manage(*grant_role)
    token = re.search(r"Generated token (\w+)", project.manage("drf_create_token", operator))
    assert token, "drf_create_token printed no token"
    project.manage(
        "createsuperuser",
        "--noinput",
        "--username",
        "owner",
        "--email",
        "owner@example.com",
        DJANGO_SUPERUSER_PASSWORD=PASSWORD,
    )
    owner = re.search(r"Generated token (\w+)", project.manage("drf_create_token", "owner"))
    assert owner

    # The static files travel in the wheel and the host's finders see them.
    found = project.manage("findstatic", "dashboard/app.css", "--verbosity", "0").strip()
    assert Path(found).is_relative_to(site_packages), found

    serve = ["{port}" if arg == "8000" else arg for arg in serve]
    assert "{port}" in serve, serve
    server = Server(project, ["manage.py", *serve], tmp_path / "serve.log")
    worker = Background(project, ["manage.py", *runworker], tmp_path / "runworker.log")
    reaping = Background(project, ["manage.py", *reaper], tmp_path / "reaper.log")
    processes = {"serve": server, "runworker": worker, "reaper": reaping}
    try:
        server.wait_ready()
        # Each command prints its own lines without any LOGGING of the host's.
        worker.wait_for_output("worker.started")
        reaping.wait_for_output("reaper.started")

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
        wait_until_ended(server.url, token.group(1), job_ids)
        state = project.shell_json(READ_STATE, JOB_IDS=" ".join(job_ids))
        assert state["paid"] == [True, True]
        for (queue, status, result, events), number in zip(
            state["jobs"], ("F-1", "F-2"), strict=True
        ):
            assert (queue, status, result) == (
                "default",
                "succeeded",
                {"number": number, "total": "12.50"},
            )
            assert {"job.enqueued", "job.started", "billing.paid", "job.succeeded"} <= set(events)
        assert state["rest_framework"] == HOST_REST_FRAMEWORK  # ours never touches the host's

        check_api(server.url, token.group(1), job_ids)
        check_metrics(server.url, token.group(1))
        check_remote_worker(server.url, owner.group(1))
        session = check_dashboard(server.url, operator, password, job_ids)
        check_websocket(server.url, session)
        check_browser(server.url, operator, password, token.group(1))
    except BaseException:
        for name, process in processes.items():
            print(f"--- {name}\n{process.output()}")
        raise
    finally:
        codes = {name: process.stop() for name, process in processes.items()}
    assert codes["runworker"] == 0, worker.output()
    assert "worker.stopped" in worker.output()
    assert "Traceback" not in server.output(), server.output()
    assert "Traceback" not in reaping.output(), reaping.output()


def test_host_project_problems_are_named_with_their_fix(host_project: HostProject) -> None:
    """A package hiding ours, and settings or URLs without the recipe: ``check`` names the fix."""
    project = host_project
    shadow = project.root / "dashboard"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("")
    try:
        with pytest.raises(AssertionError) as failed:
            project.manage("check")
    finally:
        shutil.rmtree(shadow)
    message = str(failed.value)
    assert "The control plane's package 'dashboard' is hidden" in message, message
    assert str(shadow) in message and "Rename it" in message, message

    bare = (project.root / "mysite" / "settings.py").read_text()
    bare = bare.replace("django_controlplane.configure(globals())", "")
    bare = bare.replace("INSTALLED_APPS = [", "INSTALLED_APPS = [*django_controlplane.APPS,")
    bare = bare.replace("import django_controlplane\n", "")
    project.write("mysite/bare_settings.py", f"import django_controlplane\n{bare}")
    project.write("mysite/bare_urls.py", "urlpatterns = []\n")
    project.edit("mysite/bare_settings.py", "'mysite.urls'", "'mysite.bare_urls'")
    with pytest.raises(AssertionError) as failed:
        project.manage("check", DJANGO_SETTINGS_MODULE="mysite.bare_settings")
    message = str(failed.value)
    assert "controlplane.E001" in message and "configure(globals())" in message, message
    assert "controlplane.E004" in message, message  # no static-files middleware
    assert "controlplane.E005" in message and "STATIC_ROOT" in message, message
    assert "controlplane.E006" in message and 'include("django_controlplane.urls")' in message, (
        message
    )


def wait_until_ended(url: str, token: str, job_ids: list[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=url, timeout=10, headers={"Authorization": f"Token {token}"}) as api:
        while True:
            statuses = [api.get(f"/ops/jobs/{job_id}").json()["status"] for job_id in job_ids]
            if all(s in ("succeeded", "failed", "cancelled") for s in statuses):
                return
            assert time.monotonic() < deadline, f"jobs still {statuses} after {timeout} s"
            time.sleep(0.2)


def check_metrics(url: str, token: str) -> None:
    """``/ops/metrics``: Prometheus text for a reader, nothing for anyone else."""
    scraped = httpx.get(f"{url}/ops/metrics", headers={"Authorization": f"Token {token}"})
    assert scraped.status_code == 200, scraped.text
    assert scraped.headers["content-type"].startswith("text/plain")
    assert re.search(r'^controlplane_jobs\{.*queue="default".*\} ', scraped.text, re.M), (
        scraped.text[:2000]
    )
    assert httpx.get(f"{url}/ops/metrics").status_code in (401, 403)


def check_remote_worker(url: str, token: str) -> None:
    """A remote worker registers, claims, completes and leaves over ``/ops/``."""
    echo = {
        "name": "remote.echo",
        "queue": "remote",
        "payload_schema": {"type": "object", "properties": {"text": {"type": "string"}}},
    }
    with httpx.Client(base_url=url, timeout=15, headers={"Authorization": f"Token {token}"}) as api:
        worker = api.post("/ops/workers", json={"name": "far", "operations": [echo]})
        assert worker.status_code == 201, worker.text
        worker_id = worker.json()["id"]
        enqueued = api.post(
            "/ops/jobs", json={"operation": "remote.echo", "payload": {"text": "hi"}}
        )
        assert enqueued.status_code == 201, enqueued.text
        claimed = api.post(f"/ops/workers/{worker_id}/claim", json={"wait": 5}).json()["jobs"]
        assert [j["id"] for j in claimed] == [enqueued.json()["id"]], claimed
        done = api.post(
            f"/ops/jobs/{claimed[0]['id']}/complete",
            json={"lease_token": claimed[0]["lease_token"], "result": {"echo": "hi"}},
        )
        assert done.status_code == 200, done.text
        assert api.get(f"/ops/jobs/{claimed[0]['id']}").json()["status"] == "succeeded"
        assert api.delete(f"/ops/workers/{worker_id}").status_code in (200, 204)


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


def check_dashboard(url: str, username: str, password: str, job_ids: list[str]) -> str:
    """The dashboard under /ops/, signed in on its own page; the session id."""
    with httpx.Client(base_url=url, timeout=10) as browser:
        root = browser.get("/ops/")
        assert (root.status_code, root.headers["location"]) == (302, "/ops/dashboard/")
        anonymous = browser.get("/ops/dashboard/")
        assert anonymous.status_code == 302
        assert anonymous.headers["location"] == "/ops/accounts/login/?next=/ops/dashboard/"

        form = browser.get("/ops/accounts/login/")
        assert form.status_code == 200, form.text
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
        assert csrf, form.text
        login = browser.post(
            "/ops/accounts/login/",
            data={"username": username, "password": password, "csrfmiddlewaretoken": csrf[1]},
        )
        assert (login.status_code, login.headers.get("location")) == (302, "/ops/dashboard/")

        overview = browser.get("/ops/dashboard/")
        assert overview.status_code == 200, overview.text
        assert 'href="/ops/dashboard/jobs/"' in overview.text
        assert 'data-ws="/ops/ws/dashboard/"' in overview.text
        # Served by the web process itself (startproject's DEBUG = True keeps the plain names).
        css = re.search(r'href="(/static/dashboard/app(\.[0-9a-f]{12})?\.css)"', overview.text)
        assert css, overview.text
        styles = browser.get(css[1], headers={"Accept-Encoding": "gzip"})
        assert styles.status_code == 200, styles.text
        assert styles.headers["content-type"].startswith("text/css")

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
