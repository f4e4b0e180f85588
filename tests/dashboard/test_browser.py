"""End to end in headless Chromium: a live server, real workers, a real ZooKeeper.

Debian's chromium drives the pages through Playwright (never a downloaded browser).
Waits are on page conditions with deadlines, never sleeps. The screenshots of the
README are taken here: into each test's temporary directory, so that a test run leaves
the checkout as it was, and into docs/screenshots/ with `make screenshots`
(ZKTASKS_SCREENSHOTS=docs/screenshots).
"""

import os
import re
from pathlib import Path

import pytest

from tests import tasks
from tests.dashboard import tasks as dash_tasks

CHROMIUM = "/usr/bin/chromium"
APT = "apt-get install -y chromium chromium-driver"
ROOT = Path(__file__).resolve().parents[2]
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
WAIT = 20_000  # ms


@pytest.fixture
def shots(tmp_path):
    """Where this test's screenshots go: ZKTASKS_SCREENSHOTS (relative to the checkout),
    or a directory of the test's own."""
    where = os.environ.get("ZKTASKS_SCREENSHOTS")
    directory = ROOT / where if where else tmp_path / "screenshots"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def _saved(path: Path) -> None:
    # A rendered page, not a blank image (an empty admin page is tens of KB as PNG).
    assert path.stat().st_size > 10_000, f"{path} is {path.stat().st_size} bytes"


@pytest.fixture(scope="module")
def browser():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: the browser tests need Debian's Chromium. "
                    f"Install it with: {APT}", pytrace=False)
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop running in this thread, which makes
    # Django refuse ORM calls here (users, flushes between tests): they stay synchronous
    # and safe, so say so for as long as the browser lives.
    with pytest.MonkeyPatch.context() as patch, sync_playwright() as playwright:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, live_server, zk_settings, django_user_model):
    """A logged-in superuser's page on the dashboard."""
    django_user_model.objects.create_superuser("admin", "admin@example.com", "pw")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(WAIT)
    page.goto(f"{live_server.url}/admin/login/?next=/admin/zktasks/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "pw")
    page.click("input[type=submit]")
    page.wait_for_url(re.compile(r"/admin/zktasks/$"))
    yield page
    context.close()


def state_of(page):
    return page.locator("#zk-job-state .zk-state")


def test_a_job_moves_from_pending_to_running_to_succeeded(page, live_server, start_worker,
                                                          tmp_path):
    from playwright.sync_api import expect

    release = tmp_path / "release"
    job = tasks.wait_for_file.submit(str(release), "released")  # no worker yet: pending
    expect(page.locator("[data-live='totals.pending']")).to_have_text("1")

    page.goto(f"{live_server.url}/admin/zktasks/pending/?queue=default")
    expect(page.locator("#zk-pending")).to_contain_text(job.id)

    page.goto(f"{live_server.url}/admin/zktasks/job/{job.id}/")
    expect(state_of(page)).to_have_text("pending")
    start_worker()
    expect(state_of(page)).to_have_text("running")
    release.touch()
    expect(state_of(page)).to_have_text("succeeded")
    expect(page.locator("#zk-return")).to_have_text("'released'")


def test_a_failure_shows_its_traceback_and_retry_works_from_the_page(page, live_server,
                                                                     start_worker, tmp_path,
                                                                     shots):
    from playwright.sync_api import expect

    start_worker()
    marker = tmp_path / "fixed"
    job = dash_tasks.fails_until_file.submit(str(marker))
    page.goto(f"{live_server.url}/admin/zktasks/job/{job.id}/")
    expect(state_of(page)).to_have_text("failed")
    traceback = page.locator("#zk-errors .zk-traceback").last
    expect(traceback).to_contain_text("Traceback (most recent call last)")
    expect(traceback).to_contain_text(f"RuntimeError: {marker} does not exist yet")
    page.screenshot(path=str(shots / "job-failed.png"), full_page=True)
    _saved(shots / "job-failed.png")

    marker.touch()
    page.click("#zk-retry")
    expect(page.locator("h1")).to_have_text(f"Retry job {job.id}")
    page.click("#zk-confirm")
    expect(page.locator(".messagelist .success")).to_contain_text("one more attempt")
    expect(state_of(page)).to_have_text("succeeded")
    expect(page.locator("#zk-return")).to_have_text("'recovered'")
    expect(page.locator(".zk-fields")).to_contain_text("2 of at most 2")


def test_screenshots_of_the_main_pages(page, live_server, start_worker, backend, tmp_path,
                                       shots):
    from playwright.sync_api import expect

    start_worker(name="web-1", queues=["default"], concurrency=2)
    start_worker(name="mail-1", queues=["emails"], concurrency=1)
    for i in range(6):
        tasks.add.submit(i, i).wait(timeout=30)
    for address in ("ada@example.com", "grace@example.com"):
        dash_tasks.send.submit(address).wait(timeout=30)
    tasks.boom.submit("card declined").wait(timeout=30)
    dash_tasks.fails_until_file.submit(str(tmp_path / "never")).wait(timeout=30)
    release = tmp_path / "release"
    for _ in range(2):
        tasks.wait_for_file.submit(str(release), "ok")
    from datetime import timedelta

    from django.utils import timezone

    tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).submit(1, 1)
    for n, priority in enumerate((0, 5, 0, -3)):  # a queue no worker serves: pending
        dash_tasks.echo.using(queue_name="reports", priority=priority).submit(f"report {n}")

    page.goto(f"{live_server.url}/admin/zktasks/")
    expect(page.locator("[data-live='totals.assigned']")).to_have_text("2")
    expect(page.locator("#zk-failures")).to_contain_text("card declined")
    page.screenshot(path=str(shots / "overview.png"), full_page=True)
    _saved(shots / "overview.png")

    page.goto(f"{live_server.url}/admin/zktasks/pending/?queue=reports")
    expect(page.locator("#zk-pending tbody tr")).to_have_count(4)
    page.screenshot(path=str(shots / "pending.png"), full_page=True)
    _saved(shots / "pending.png")

    page.goto(f"{live_server.url}/admin/zktasks/assignments/")
    expect(page.locator(".zk-owner", has_text="web-1")).to_contain_text("2 assigned")
    page.screenshot(path=str(shots / "assignments.png"), full_page=True)
    _saved(shots / "assignments.png")

    page.goto(f"{live_server.url}/admin/zktasks/job/")
    expect(page.locator("#zk-results tbody tr")).to_have_count(10)
    page.screenshot(path=str(shots / "results.png"), full_page=True)
    _saved(shots / "results.png")

    page.goto(f"{live_server.url}/admin/zktasks/tree/?path=/workers")
    page.locator("td.zk-mono a").first.click()
    expect(page.locator("#zk-data")).to_contain_text('"concurrency"')
    page.screenshot(path=str(shots / "tree.png"), full_page=True)
    _saved(shots / "tree.png")

    dark = page.context.browser.new_context(viewport={"width": 1280, "height": 900},
                                            color_scheme="dark")
    dark.add_cookies(page.context.cookies())
    dark_page = dark.new_page()
    dark_page.goto(f"{live_server.url}/admin/zktasks/")
    expect(dark_page.locator("#zk-failures")).to_contain_text("card declined")
    dark_page.screenshot(path=str(shots / "overview-dark.png"), full_page=True)
    _saved(shots / "overview-dark.png")
    dark.close()
    release.touch()


def test_the_page_shows_a_banner_while_zookeeper_is_down(page, live_server, settings, zk_root):
    from playwright.sync_api import expect

    from tests.conftest import zk_tasks_setting
    from zktasks.testing import ZooKeeperServer

    with ZooKeeperServer() as server:
        settings.TASKS = zk_tasks_setting(server.hosts, zk_root, SESSION_TIMEOUT=20.0)
        tasks.add.submit(1, 1)
        page.goto(f"{live_server.url}/admin/zktasks/")
        banner = page.locator("#zk-banner")
        expect(page.locator("[data-live='totals.pending']")).to_have_text("1")
        expect(banner).to_be_hidden()
        server.stop()
        expect(banner).to_be_visible()
        expect(banner).to_contain_text("ZooKeeper unreachable")
        server.start()
        expect(banner).to_be_hidden(timeout=30_000)
        tasks.add.submit(2, 2)
        expect(page.locator("[data-live='totals.pending']")).to_have_text("2")


def test_dead_letters_appear_live_and_a_screenshot(page, live_server, start_worker, backend,
                                                   settings, zk_client, shots):
    """Garbage planted while the page is open shows up by itself; then it is re-queued."""
    from playwright.sync_api import expect

    from zktasks.backend import ZooKeeperBackend

    start_worker(name="web-1")
    tasks.add.submit(1, 1).wait(timeout=30)
    page.goto(f"{live_server.url}/admin/zktasks/deadletters/")
    expect(page.locator("#zk-deadletters")).to_contain_text("No dead letters")

    layout = backend.store.layout
    zk_client.create(layout.unsharded_job("default", "report-2024.csv"),
                     b"id,total\n1,<b>42</b>\n")
    zk_client.create(layout.delayed_job("tmp-lock"), b"\x00\x17\xfe\xff" * 8)
    params = {**settings.TASKS["default"]}
    params["OPTIONS"] = {**params["OPTIONS"], "SIGNING_KEY": "the-old-key"}
    forged = ZooKeeperBackend("default", params).enqueue(dash_tasks.send, ("ada@example.com",),
                                                         {})
    backend.wait(forged.id, timeout=30)
    expect(page.locator("tr.zk-deadletter")).to_have_count(3)
    expect(page.locator("#zk-deadletters")).to_contain_text("foreign_signature")
    expect(page.locator("#zk-deadletters")).to_contain_text("id,total")
    page.locator("tr.zk-deadletter", has_text="report-2024.csv").locator("summary").click()
    page.screenshot(path=str(shots / "dead-letters.png"), full_page=True)
    _saved(shots / "dead-letters.png")

    page.goto(f"{live_server.url}/admin/zktasks/")
    expect(page.locator("[data-live='totals.dead_letters']")).to_have_text("3")
    page.click("[data-live='totals.dead_letters']")
    page.locator("tr.zk-deadletter", has_text="tmp-lock").get_by_text("Discard").click()
    page.click("#zk-confirm")
    expect(page.locator(".messagelist .success")).to_contain_text("Discarded")
    expect(page.locator("tr.zk-deadletter")).to_have_count(2)


def test_a_refresh_that_fails_keeps_the_page_and_says_why(page, live_server, backend):
    """live.json answers, but the page's own read fails (503: another web process still
    reconnecting, a read past its deadline). Its body was swapped in: the table gone,
    the banner hidden, and nothing read again until the next change."""
    from playwright.sync_api import expect

    first = tasks.add.submit(1, 1)
    page.goto(f"{live_server.url}/admin/zktasks/pending/?queue=default")
    expect(page.locator("#zk-pending")).to_contain_text(first.id)

    def unavailable(route):
        if route.request.headers.get("x-requested-with") == "XMLHttpRequest":
            route.fulfill(status=503, content_type="text/html",
                          body='<div id="zk-region"><p>ZooKeeper unreachable.</p></div>')
        else:
            route.continue_()

    pattern = "**/admin/zktasks/pending/*"
    page.route(pattern, unavailable)
    second = tasks.add.submit(2, 2)  # the pending topic changes: the region is read again
    expect(page.locator("#zk-banner")).to_be_visible()
    expect(page.locator("#zk-banner")).to_contain_text("HTTP 503")
    expect(page.locator("#zk-pending")).to_contain_text(first.id)  # kept, not emptied
    page.unroute(pattern, unavailable)
    expect(page.locator("#zk-pending")).to_contain_text(second.id)  # read again
    expect(page.locator("#zk-banner")).to_be_hidden()


def test_an_opened_entry_stays_open_when_new_rows_come_above_it(page, live_server,
                                                               start_worker, backend,
                                                               zk_client):
    """Open <details> were remembered by their place among the open ones and reopened by
    place among all: a new dead letter on top closed the one being read and opened
    another."""
    from playwright.sync_api import expect

    start_worker()  # its leader moves the garbage aside
    tasks.add.submit(1, 1).wait(timeout=30)
    layout = backend.store.layout
    for name in ("first.csv", "second.csv"):
        zk_client.create(layout.unsharded_job("default", name), f"{name} data".encode())
    page.goto(f"{live_server.url}/admin/zktasks/deadletters/")
    rows = page.locator("tr.zk-deadletter")
    expect(rows).to_have_count(2)

    def details(name):
        return rows.filter(has_text=name).locator("details")

    details("first.csv").locator("summary").click()
    expect(details("first.csv")).to_have_js_property("open", True)
    zk_client.create(layout.unsharded_job("default", "third.csv"), b"third.csv data")
    expect(rows).to_have_count(3)
    expect(details("first.csv")).to_have_js_property("open", True)
    expect(details("second.csv")).to_have_js_property("open", False)
    expect(details("third.csv")).to_have_js_property("open", False)
