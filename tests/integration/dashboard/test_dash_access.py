"""Who may see and who may act: login, roles, CSRF, and the permission checks in views."""

from __future__ import annotations

import pytest
from django.test import Client

from jobs.models import Queue
from jobs.states import QUEUED
from tests.factories import failed, fresh, make_user, queued

PAGES = ["/dashboard/", "/dashboard/jobs/", "/dashboard/workers/", "/dashboard/queues/"]


@pytest.mark.django_db
def test_root_redirects_to_the_dashboard() -> None:
    response = Client().get("/")
    assert response.status_code == 302
    assert response["Location"] == "/dashboard/"


@pytest.mark.django_db
@pytest.mark.parametrize("path", [*PAGES, "/dashboard/jobs/live/"])
def test_anonymous_users_are_sent_to_login(path: str) -> None:
    response = Client().get(path)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")


@pytest.mark.django_db
def test_anonymous_job_page_and_actions_go_to_login() -> None:
    job = queued()
    for path in (f"/dashboard/jobs/{job.pk}/", f"/dashboard/jobs/{job.pk}/live/"):
        assert Client().get(path)["Location"].startswith("/accounts/login/")
    response = Client().post(f"/dashboard/jobs/{job.pk}/cancel/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]
    assert fresh(job).status == QUEUED


@pytest.mark.django_db
def test_login_page_renders_and_logs_in(settings) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    make_user("viewer", "vera", password=True)
    client = Client()
    page = client.get("/accounts/login/")
    assert page.status_code == 200 and b"Sign in" in page.content
    response = client.post(
        "/accounts/login/",
        {"username": "vera", "password": "correct horse battery staple", "next": "/dashboard/"},
    )
    assert response.status_code == 302 and response["Location"] == "/dashboard/"
    assert client.get("/dashboard/").status_code == 200


@pytest.mark.parametrize("path", PAGES)
def test_a_user_without_a_role_is_refused(nobody_client: Client, path: str) -> None:
    assert nobody_client.get(path).status_code == 403


@pytest.mark.parametrize("path", PAGES)
def test_viewers_see_every_page(viewer_client: Client, path: str) -> None:
    response = viewer_client.get(path)
    assert response.status_code == 200
    assert "script-src 'self'" in response["Content-Security-Policy"]


def test_viewers_see_no_action_buttons(viewer_client: Client) -> None:
    job = queued()
    dead = failed()
    Queue.objects.create(name=job.queue)
    for path in (
        f"/dashboard/jobs/{job.pk}/",
        f"/dashboard/jobs/{dead.pk}/",
        "/dashboard/jobs/",
        "/dashboard/queues/",
    ):
        html = viewer_client.get(path).content.decode()
        for label in (
            ">Cancel<",
            ">Retry<",
            ">Pause<",
            ">Resume<",
            "Cancel selected",
            'name="ids"',
        ):
            assert label not in html, (path, label)


def test_operators_see_action_buttons(operator_client: Client) -> None:
    job = queued()
    assert ">Cancel</button>" in operator_client.get(f"/dashboard/jobs/{job.pk}/").content.decode()
    dead = failed()
    assert ">Retry</button>" in operator_client.get(f"/dashboard/jobs/{dead.pk}/").content.decode()
    assert ">Pause</button>" in operator_client.get("/dashboard/queues/").content.decode()


def test_viewers_are_refused_every_action(viewer_client: Client) -> None:
    job = queued()
    dead = failed()
    posts = [
        (f"/dashboard/jobs/{job.pk}/cancel/", {}),
        (f"/dashboard/jobs/{dead.pk}/retry/", {}),
        (f"/dashboard/jobs/{job.pk}/requeue/", {}),
        ("/dashboard/jobs/bulk/", {"do": "cancel-filter", "confirm": "1"}),
        ("/dashboard/queues/pause/", {"name": job.queue}),
        ("/dashboard/queues/resume/", {"name": job.queue}),
        ("/dashboard/queues/cap/", {"name": job.queue, "concurrency_cap": "3"}),
    ]
    for path, data in posts:
        response = viewer_client.post(path, data)
        assert response.status_code == 403, path
        assert b"may look but not act" in response.content
    assert fresh(job).status == QUEUED
    assert fresh(dead).status == "failed"
    assert not Queue.objects.filter(name=job.queue).exists()


def test_actions_need_post(operator_client: Client) -> None:
    job = queued()
    assert operator_client.get(f"/dashboard/jobs/{job.pk}/cancel/").status_code == 405
    assert fresh(job).status == QUEUED


@pytest.mark.django_db
def test_actions_need_a_csrf_token() -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("operator"))
    job = queued()
    assert client.post(f"/dashboard/jobs/{job.pk}/cancel/").status_code == 403
    assert fresh(job).status == QUEUED
    page = client.get(f"/dashboard/jobs/{job.pk}/")
    token = page.context["csrf_token"]
    response = client.post(f"/dashboard/jobs/{job.pk}/cancel/", {"csrfmiddlewaretoken": str(token)})
    assert response.status_code == 302
    assert fresh(job).status == "cancelled"


def test_superusers_are_operators(admin_client_: Client) -> None:
    job = queued()
    response = admin_client_.post(f"/dashboard/jobs/{job.pk}/cancel/", {"reason": "tidy"})
    assert response.status_code == 302
    assert fresh(job).status == "cancelled"


def test_redirect_after_an_action_stays_on_this_site(operator_client: Client) -> None:
    job = queued()
    response = operator_client.post(
        f"/dashboard/jobs/{job.pk}/cancel/", {"next": "https://evil.example/steal"}
    )
    assert response["Location"] == f"/dashboard/jobs/{job.pk}/"
