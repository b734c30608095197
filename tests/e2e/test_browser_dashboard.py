"""The dashboard in a real browser: login, live timeline, actions, filters, escaping, roles."""

from __future__ import annotations

import re
from datetime import UTC
from urllib.parse import parse_qs, urlsplit

import pytest
from playwright.sync_api import expect

from jobs.models import Job, JobEvent, Queue
from jobs.transitions import emit_event
from tests.conftest import wait_for
from tests.factories import (
    ECHO,
    HOSTILE_IMG,
    HOSTILE_SCRIPT,
    PASSWORD,
    failed,
    fresh,
    make_user,
    queued,
    running,
    tick,
    worker,
)

pytestmark = pytest.mark.e2e


def query_of(url: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(url).query)


def timeline_seqs(page) -> list[int]:
    return page.eval_on_selector_all(
        "#timeline > li", "items => items.map(i => Number(i.dataset.seq))"
    )


def covered_seqs(page) -> list[int]:
    """Every seq the timeline accounts for: each entry's own, and those it folded."""
    return page.eval_on_selector_all(
        "#timeline > li",
        """items => items.flatMap(i => {
            const last = Number(i.dataset.seq), first = Number(i.dataset.fromSeq || last);
            return Array.from({ length: last - first + 1 }, (_, k) => first + k);
        })""",
    )


def test_anonymous_users_are_sent_to_login_and_can_sign_in(open_page) -> None:
    make_user("viewer", "olga", password=True)
    page = open_page(None)
    page.goto("/")
    expect(page).to_have_url(re.compile(r"/accounts/login/\?next=/dashboard/$"))
    page.goto("/dashboard/jobs/")
    expect(page).to_have_url(re.compile(r"/accounts/login/\?next=/dashboard/jobs/$"))
    page.fill("input[name=username]", "olga")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    expect(page).to_have_url(re.compile(r"/dashboard/jobs/$"))
    expect(page.locator(".who-name")).to_have_text("olga")
    expect(page.locator(".role")).to_have_text("viewer")


def test_a_running_jobs_timeline_and_progress_update_without_reload(open_page) -> None:
    job, held = running(ECHO, {"seconds": 3})
    page = open_page("viewer")
    page.goto(f"/dashboard/jobs/{job.pk}/")
    expect(page.locator("#live")).to_have_attribute("data-state", "live")
    page.evaluate("window.__sameDocument = true")
    tick(job, held, 1, 3, "first step done")
    expect(page.locator("#timeline")).to_contain_text("first step done")
    expect(page.locator("#job-progress")).to_contain_text("1 / 3")
    tick(job, held, 2, 3, "second step done")
    expect(page.locator("#timeline > li")).to_have_count(4)
    expect(page.locator("#job-progress progress")).to_have_attribute("value", "66.7")
    expect(page.locator("#job-progress")).to_contain_text("Estimated finish")
    assert page.evaluate("window.__sameDocument") is True
    seqs = timeline_seqs(page)
    assert seqs == [1, 2, 3, 4]


def test_live_updates_wait_while_an_operator_types_a_reason(open_page) -> None:
    job, held = running()
    page = open_page("operator")
    page.goto(f"/dashboard/jobs/{job.pk}/")
    expect(page.locator("#live")).to_have_attribute("data-state", "live")
    reason = page.locator("#job-head input[name=reason]")
    reason.fill("half-typed")
    tick(job, held, 1, 2, "while typing")
    tick(job, held, 2, 2, "still typing")
    page.wait_for_timeout(800)  # two relay ticks: the pushes are held, not applied
    expect(reason).to_have_value("half-typed")
    page.locator("h2", has_text="Timeline").click()  # focus leaves the form
    expect(page.locator("#timeline")).to_contain_text("while typing")
    expect(page.locator("#timeline")).to_contain_text("still typing")
    assert timeline_seqs(page) == [1, 2, 3, 4]


def test_the_timeline_falls_back_to_polling_when_the_socket_cannot_connect(open_page) -> None:
    job, held = running()
    page = open_page("viewer")
    page.route_web_socket(re.compile(r".*/ws/dashboard/"), lambda ws: ws.close())
    page.goto(f"/dashboard/jobs/{job.pk}/")
    expect(page.locator("#live")).to_have_attribute("data-state", "polling")
    tick(job, held, 1, 2, "arrived by polling")
    expect(page.locator("#timeline")).to_contain_text("arrived by polling")
    # Nothing changes any more: the interval doubles (0.5 s, 1 s, 2 s ...).
    wait_for(
        lambda: page.evaluate("window.__live.interval()") >= 2000,
        timeout=10,
        message="the polling interval to back off",
    )
    tick(job, held, 2, 2, "still arriving")
    expect(page.locator("#timeline")).to_contain_text("still arriving", timeout=10_000)
    expect(page.locator("#timeline > li")).to_have_count(4)


def test_cancel_then_retry_from_the_job_page(open_page) -> None:
    job, _ = running()
    page = open_page("operator", username="olivia")
    page.goto(f"/dashboard/jobs/{job.pk}/")
    head = page.locator("#job-head")
    expect(head.locator(".badge")).to_have_text("running")
    expect(head.get_by_role("button", name="Retry")).to_have_count(0)
    head.locator("input[name=reason]").fill("customer asked")
    head.get_by_role("button", name="Cancel").click()
    expect(page.locator(".message-success")).to_have_text("Job cancelled.")
    expect(head.locator(".badge")).to_have_text("cancelled")
    expect(page.locator("#timeline")).to_contain_text("job.cancelled")
    expect(page.locator("#timeline")).to_contain_text("customer asked")
    expect(page.locator("#timeline")).to_contain_text("olivia")
    head.get_by_role("button", name="Retry").click()
    expect(head.locator(".badge")).to_have_text("queued")
    expect(page.locator("#timeline")).to_contain_text("job.retried")
    assert fresh(job).status == "queued"
    retried = JobEvent.objects.get(job=job, event="job.retried")
    assert retried.fields["by"] == "olivia"


def test_state_changes_made_elsewhere_appear_live(open_page) -> None:
    job = queued()
    page = open_page("operator")
    page.goto(f"/dashboard/jobs/{job.pk}/")
    expect(page.locator("#live")).to_have_attribute("data-state", "live")
    from jobs.transitions import cancel_job

    cancel_job(job.pk, by="api-user", reason="from the API")
    expect(page.locator("#job-head .badge")).to_have_text("cancelled")
    expect(page.locator("#job-head").get_by_role("button", name="Retry")).to_be_visible()
    # A form pushed over the socket has no CSRF field of its own: the page adds its token.
    page.locator("#job-head").get_by_role("button", name="Retry").click()
    expect(page.locator(".message-success")).to_have_text("Job queued again.")


def test_filters_live_in_the_url_and_bulk_cancel_acts_on_the_filter(open_page) -> None:
    hits = [queued(ECHO, {"account": 42}, queue="billing") for _ in range(3)]
    other_account = queued(ECHO, {"account": 7}, queue="billing")
    other_queue = queued(ECHO, {"account": 42}, queue="mail")
    page = open_page("operator", username="bulk-op")
    page.goto("/dashboard/jobs/")
    page.select_option("select[name=queue]", "billing")
    page.click("summary")
    page.fill("input[name=payload]", '{"account": 42}')
    page.get_by_role("button", name="Apply").click()
    expect(page).to_have_url(re.compile(r"\?queue=billing&payload=%7B%22account%22%3A\+?42%7D$"))
    expect(page.locator("#job-rows tr[data-job-id]")).to_have_count(3)
    shared = page.url
    page.get_by_role("button", name="Cancel all matching…").click()
    expect(page.locator("h1")).to_contain_text("Cancel 3 jobs?")
    page.fill("input[name=reason]", "duplicate invoices")
    page.get_by_role("button", name="Cancel 3 jobs").click()
    expect(page.locator(".message-success")).to_have_text("Cancelled 3 jobs.")
    assert query_of(page.url) == query_of(shared)  # back on the same filtered view
    expect(page.locator("#job-rows .badge")).to_have_text(["cancelled"] * 3)
    assert {fresh(j).status for j in hits} == {"cancelled"}
    assert fresh(other_account).status == fresh(other_queue).status == "queued"
    reasons = JobEvent.objects.filter(event="job.cancelled").values_list("fields", flat=True)
    assert all(f == {"by": "bulk-op", "reason": "duplicate invoices"} for f in reasons)


def test_bulk_retry_on_a_selection(open_page) -> None:
    first, second, third = (failed(queue="sel") for _ in range(3))
    page = open_page("operator")
    page.goto("/dashboard/jobs/?queue=sel")
    expect(page.get_by_role("button", name="Retry selected")).to_be_disabled()
    page.check(f'input[name=ids][value="{first.pk}"]')
    page.check(f'input[name=ids][value="{third.pk}"]')
    expect(page.locator("#selected-count")).to_have_text("2")
    page.get_by_role("button", name="Retry selected").click()
    expect(page.locator("h1")).to_contain_text("Retry 2 jobs?")
    page.get_by_role("button", name="Retry 2 jobs").click()
    expect(page.locator(".message-success")).to_have_text("Retried 2 jobs.")
    assert [fresh(j).status for j in (first, second, third)] == ["queued", "failed", "queued"]


def test_the_job_list_updates_rows_live(open_page) -> None:
    job, held = running(queue="watched")
    page = open_page("viewer")
    page.goto("/dashboard/jobs/?queue=watched")
    expect(page.locator("#live")).to_have_attribute("data-state", "live")
    row = page.locator(f"#job-{job.pk}")
    expect(row.locator(".badge")).to_have_text("running")
    from jobs.transitions import complete_job

    complete_job(job.pk, lease_token=held.lease_token, result={"done": True})
    expect(row.locator(".badge")).to_have_text("succeeded")
    queued(queue="watched")
    expect(page.locator("#new-banner")).to_contain_text("1 new job matches")


def test_hostile_job_data_is_shown_as_text_and_never_runs(open_page) -> None:
    payload = {"note": HOSTILE_SCRIPT, "img": HOSTILE_IMG}
    job, held = running(ECHO, payload, queue="hostile")
    emit_event(
        job.pk,
        event="note",
        message=HOSTILE_IMG,
        fields={"x": HOSTILE_SCRIPT},
        lease_token=held.lease_token,
    )
    dead = failed(ECHO, payload, queue="hostile", code=HOSTILE_IMG, message=HOSTILE_SCRIPT)
    page = open_page("operator")
    for path in (
        f"/dashboard/jobs/{job.pk}/",
        f"/dashboard/jobs/{dead.pk}/",
        "/dashboard/jobs/?queue=hostile",
        "/dashboard/",
        "/dashboard/queues/",
        "/dashboard/workers/",
    ):
        page.goto(path)
        page.wait_for_load_state("load")
        assert page.evaluate("typeof window.__pwned") == "undefined", path
    page.goto(f"/dashboard/jobs/{job.pk}/")
    expect(page.locator("pre.json")).to_contain_text(HOSTILE_SCRIPT.replace('"', '\\"'))
    expect(page.locator("#timeline")).to_contain_text(HOSTILE_IMG)
    assert page.locator("#timeline img, pre img, script:not([src])").count() == 0
    # The same through a live push.
    expect(page.locator("#live")).to_have_attribute("data-state", "live")
    emit_event(
        job.pk, event="note", message=HOSTILE_SCRIPT + HOSTILE_IMG, lease_token=held.lease_token
    )
    expect(page.locator("#timeline > li")).to_have_count(4)
    expect(page.locator("#timeline > li").last).to_contain_text(HOSTILE_SCRIPT)
    page.wait_for_timeout(200)
    assert page.evaluate("typeof window.__pwned") == "undefined"
    page.goto(f"/dashboard/jobs/{dead.pk}/")
    expect(page.locator(".error-class")).to_have_text(HOSTILE_IMG)


def test_a_viewer_sees_no_buttons_and_is_refused_when_posting(open_page) -> None:
    job = queued(queue="viewonly")
    dead = failed(queue="viewonly")
    page = open_page("viewer")
    page.goto(f"/dashboard/jobs/{job.pk}/")
    expect(page.get_by_role("button", name="Cancel")).to_have_count(0)
    page.goto(f"/dashboard/jobs/{dead.pk}/")
    expect(page.get_by_role("button", name="Retry")).to_have_count(0)
    page.goto("/dashboard/jobs/?queue=viewonly")
    expect(page.locator("input[name=ids]")).to_have_count(0)
    expect(page.get_by_role("button", name=re.compile("Cancel|Retry"))).to_have_count(0)
    page.goto("/dashboard/queues/")
    expect(page.get_by_role("button", name=re.compile("^(Pause|Resume)$"))).to_have_count(0)
    token = page.get_attribute('meta[name="csrf-token"]', "content")
    for path, form in (
        (f"/dashboard/jobs/{job.pk}/cancel/", {}),
        (f"/dashboard/jobs/{dead.pk}/retry/", {}),
        ("/dashboard/queues/pause/", {"name": "viewonly"}),
        ("/dashboard/jobs/bulk/", {"do": "cancel-filter", "confirm": "1"}),
    ):
        response = page.request.post(
            path,
            form={**form, "csrfmiddlewaretoken": token},
            headers={"X-CSRFToken": token, "Referer": page.url},
        )
        assert response.status == 403, path
        assert "may look but not act" in response.text()
    assert fresh(job).status == "queued" and fresh(dead).status == "failed"
    assert not Queue.objects.filter(name="viewonly", paused=True).exists()


def test_pause_and_resume_a_queue(open_page) -> None:
    queued(queue="pausable")
    page = open_page("operator")
    page.goto("/dashboard/queues/")
    row = page.locator('tr[data-queue="pausable"]')
    row.get_by_role("button", name="Pause").click()
    expect(page.locator(".message-success")).to_contain_text("Queue pausable paused")
    expect(row.locator(".flag-warn")).to_have_text("paused")
    assert Queue.objects.get(name="pausable").paused
    row.get_by_role("button", name="Resume").click()
    expect(row.locator(".flag-good")).to_have_text("active")
    assert not Queue.objects.get(name="pausable").paused
    row.locator("input[name=concurrency_cap]").fill("3")
    row.get_by_role("button", name="Save concurrency cap").click()
    expect(page.locator(".message-success")).to_contain_text("at most 3 jobs at once")
    assert Queue.objects.get(name="pausable").concurrency_cap == 3
    row.locator("input[name=rate_limit_per_second]").fill("2.5")
    row.get_by_role("button", name="Save rate limit").click()
    expect(page.locator(".message-success")).to_be_visible()
    assert Queue.objects.get(name="pausable").rate_limit_per_second == 2.5


def test_requeue_a_job_orphaned_by_a_dead_worker(open_page) -> None:
    dead = worker(stale=True, hostname="gone-host")
    orphan, _ = running(worker_id=dead.pk, queue="orph")
    page = open_page("operator")
    page.goto("/dashboard/workers/")
    expect(page.locator("tr.is-stale")).to_contain_text("gone-host")
    expect(page.locator("tr.is-stale .flag-bad")).to_have_text("stale")
    # The heartbeat's age shows its absolute time on hover.
    beat = dead.last_heartbeat.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    expect(page.locator("tr.is-stale [data-age]")).to_have_attribute("title", beat)
    page.get_by_role("button", name="Requeue").click()
    expect(page.locator(".message-success")).to_contain_text("Job requeued")
    assert Job.objects.get(pk=orphan.pk).status == "queued"
    expect(page.get_by_role("button", name="Requeue")).to_have_count(0)


def test_a_real_worker_runs_a_job_while_the_page_watches(open_page, start_process) -> None:
    from jobs.enqueue import enqueue

    queue = "e2e-real-worker"
    job = enqueue("sleep", {"seconds": 1.5, "emit_every": 0.3}, queue=queue)
    page = open_page("viewer")
    page.goto(f"/dashboard/jobs/{job.pk}/")
    expect(page.locator("#live")).to_have_attribute("data-state", "live")
    worker_process = start_process("runworker", "--queue", queue, "--concurrency", "1")
    expect(page.locator("#job-head .badge")).to_have_text("running", timeout=20_000)
    expect(page.locator("#timeline")).to_contain_text("sleep.tick", timeout=20_000)
    expect(page.locator("#job-head .badge")).to_have_text("succeeded", timeout=20_000)
    expect(page.locator("#job-progress")).to_contain_text("5 / 5")
    expect(page.locator("#timeline")).to_contain_text("job.succeeded")
    expect(page.locator("#job-outcome")).to_contain_text("slept")
    # The quiet ticks arrived one by one and folded into one line, the latest.
    ticks = page.locator("#timeline > li.ev-tick")
    expect(ticks).to_have_count(1)
    expect(ticks).to_contain_text("5 progress updates")
    expect(ticks.locator(".ev-progress")).to_have_text("5 / 5")
    assert covered_seqs(page) == list(range(1, fresh(job).last_event_seq + 1)), (
        worker_process.output()
    )


def test_live_entries_fold_and_keep_the_level_filter(open_page) -> None:
    job, held = running()
    page = open_page("viewer")
    page.goto(f"/dashboard/jobs/{job.pk}/?level=warning")
    expect(page.locator("#live")).to_have_attribute("data-state", "live")
    assert timeline_seqs(page) == [2]  # the attempt's header stays
    tick(job, held, 1, 3)
    seq = emit_event(
        job.pk,
        event="disk.low",
        level="warning",
        message="shown live",
        lease_token=held.lease_token,
    )
    expect(page.locator("#timeline")).to_contain_text("shown live")
    assert timeline_seqs(page) == [2, seq]
    expect(page.locator("#timeline")).to_have_attribute("data-cursor", str(seq))
    page.get_by_role("link", name="All").click()
    expect(page.locator("#live")).to_have_attribute("data-state", "live")
    last = tick(job, held, 2, 3)
    expect(page.locator("#timeline > li.ev-tick").last).to_have_attribute("data-seq", str(last))
    tick(job, held, 3, 3)
    expect(page.locator("#timeline > li.ev-tick").last).to_contain_text("2 progress updates")
    expect(page.locator("#timeline > li.ev-tick")).to_have_count(2)  # the warning between
    assert covered_seqs(page) == list(range(1, fresh(job).last_event_seq + 1))


def test_earlier_events_and_the_theme_toggle(open_page) -> None:
    job, held = running()
    for step in range(1, 26):
        tick(job, held, step, 25, f"step {step}")
    page = open_page("viewer", color_scheme="light")
    page.goto(f"/dashboard/jobs/{job.pk}/")
    expect(page.locator("#timeline > li")).to_have_count(20)
    page.get_by_role("button", name="Show earlier events").click()
    expect(page.locator("#timeline > li")).to_have_count(27)
    seqs = timeline_seqs(page)
    assert seqs == list(range(1, 28))
    expect(page.get_by_role("button", name="Show earlier events")).to_have_count(0)
    background = "getComputedStyle(document.body).backgroundColor"
    light = page.evaluate(background)
    page.click("#theme-toggle")
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")
    assert page.evaluate(background) != light
    page.reload()  # the choice is remembered
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")


def test_an_operator_limits_a_key_family_and_sees_what_it_holds_back(open_page) -> None:
    from jobs.enqueue import JobSpec, enqueue, enqueue_many
    from jobs.keyed_claims import claim_keyed
    from jobs.models import KeyLimit

    page = open_page("operator")
    page.goto("/dashboard/queues/")
    new = page.locator("form.key-limit-new")
    new.locator("input[name=name]").fill("tenant")
    new.locator("input[name=concurrency]").fill("1")
    new.get_by_role("button", name="Set limits").click()
    expect(page.locator('tr[data-key-limit="tenant"]')).to_be_visible()
    assert KeyLimit.objects.get(name="tenant").concurrency == 1

    hostile = f"tenant:{HOSTILE_SCRIPT}"
    enqueue_many([JobSpec("ping", queue="keyed-e2e", keys=[hostile]) for _ in range(3)])
    claim_keyed(queue="keyed-e2e", worker_id=worker().pk, limit=5, lease_seconds=60)
    waiting = enqueue("ping", queue="keyed-e2e", keys=[hostile])
    page.goto("/dashboard/queues/")
    held = page.locator('[data-held-queue="keyed-e2e"]')
    expect(held).to_contain_text("at its limit 1/1")
    expect(held.locator("[data-held-total]")).to_have_text("3")
    expect(held).to_contain_text(HOSTILE_SCRIPT)  # shown as text, never run
    page.goto(f"/dashboard/jobs/{waiting.pk}/")
    expect(page.locator("body")).to_contain_text("at its limit 1/1")
    assert page.evaluate("window.__pwned") is None
