"""The operator console in a real browser (issue 29 "Tests"): Debian's chromium driven by
Selenium against ``orbit console serve`` on MariaDB, with real archive workers, the reference
API and sender workers.

- sign in as a viewer and as an operator; every page passes axe-core with no serious or
  critical violation;
- a real job's progress advances on its page without a reload (the page's script polls);
- an operator pauses the running job from its page: the job stops at a batch boundary
  (checked in the database), and resumes from the page to SUCCEEDED;
- a viewer's forged POST is refused (403) and a cross-site form POST without the CSRF token is
  refused: nothing written;
- dead letters requeued in bulk from the page (after its preview) are sent and ACCEPTED.
"""

from __future__ import annotations

import http.server
import secrets
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from sqlalchemy import Engine, func, select

from orbit_tasks.archive.claims import GROUP_FILES
from orbit_tasks.archive.jobs import JobState
from orbit_tasks.db.business_tables import sender_outbox
from orbit_tasks.db.history_tables import audit_events
from orbit_tasks.db.platform_tables import archive_controls
from orbit_tasks.sender import enqueue
from tests.support import sender as sender_support
from tests.support.api_server import free_port
from tests.support.archive_jobs import archive_env, create_job, wait_for, wait_state
from tests.support.browser import browser, screenshot, serious_violations, until
from tests.support.browser import sign_in as browser_sign_in
from tests.support.cli import orbit_env
from tests.support.console import PASSWORDS, add_people, orbit, running_console
from tests.support.scene import archive_scene
from tests.support.sender import REDIS_URL, Workers, World, body_for, celery_env

pytestmark = [pytest.mark.mariadb, pytest.mark.redis, pytest.mark.slow]

world = sender_support.world
LEASE = 12  # seconds: a loaded machine still finishes a file within the time limits
SLOW_FILE = "archive.after_file_write=sleep:0.3"  # every file takes a while: the page sees it


def _no_serious_violations(driver: WebDriver, page: str) -> None:
    found = serious_violations(driver)
    assert not found, (page, found)


def _count(engine: Engine, table: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def _beat(ae: Any, stop: threading.Event) -> None:
    while not stop.wait(2.0):
        try:
            ae.tick()
        except Exception:  # a tick that fails (a deadlock under load) is beat's next one
            continue


@pytest.fixture
def other_site(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """Another origin (a plain HTTP server on another port) whose pages the test writes."""
    root = tmp_path / "site"
    root.mkdir()
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", root
    finally:
        server.shutdown()
        server.server_close()


def test_job_progress_pause_resume_roles_csrf_and_accessibility(
    platform_engine: Engine, mariadb_url: str, tmp_path: Path, other_site: tuple[str, Path]
) -> None:
    with archive_env(
        mariadb_url, platform_engine, tmp_path,
        ORBIT_ARCHIVE_LEASE_SECONDS=str(LEASE), ORBIT_ARCHIVE_SLICE_SECONDS="1",
    ) as ae:  # fmt: skip
        assert orbit(ae.env, "sender", "db", "upgrade").returncode == 0
        scene = archive_scene(
            platform_engine, name="acme", volume=tmp_path / "vol", kind="events", roots=600,
            batch_size=5, label="main volume",
        )  # fmt: skip
        ns, vol = scene.ns, scene.volume
        add_people(ae.env)
        ae.worker("console", [vol], failpoints=SLOW_FILE)
        job = create_job(ae, ns, "events")
        stop = threading.Event()
        beat = threading.Thread(target=_beat, args=(ae, stop), daemon=True)
        beat.start()  # what beat does: a tick every 2 s (its sweep wakes a released job)
        page = f"/jobs/acme/{job.id.hex()}"
        with running_console(ae.env) as console, browser() as driver:
            base = console.base_url
            pages = {
                "fleet": "/",
                "plans": "/plans",
                "jobs": "/jobs?namespace=acme",
                "job": page,
                "dead-letters": "/dead-letters",
                "audit": "/audit",
            }
            # --- the operator: live progress, pause at a batch boundary --------------------
            browser_sign_in(driver, base, "operator", PASSWORDS["operator"])
            driver.get(base + page)
            driver.execute_script("window.orbitNoReload = 'still here';")
            field = driver.find_element(By.CSS_SELECTOR, "[data-field='roots']")
            first = field.text
            until(lambda: field.text != first, 60, "progress on the page")
            seen = [first, field.text]
            until(lambda: field.text not in seen, 60, "more progress on the page")
            assert driver.execute_script("return window.orbitNoReload") == "still here"
            screenshot(driver, "job")
            pause = driver.find_element(
                By.CSS_SELECTOR, "form[aria-label='Pause acme/events'] button"
            )
            # between two slices the job is PENDING for a moment: pause it while it runs
            wait_for(lambda: ae.job(ns, job.id).state is JobState.RUNNING, 30, "RUNNING", 0.02)
            pause.click()
            until(lambda: "pause: namespace acme, kind events (by operator)" in driver.page_source,
                  30, "the pause's result")  # fmt: skip
            at_pause = ae.job(ns, job.id)  # read after the pause committed
            stopped = wait_for(
                lambda: (j := ae.job(ns, job.id)).state is JobState.PENDING and j, 15, "stopped"
            )
            assert stopped.batches <= at_pause.batches + GROUP_FILES  # at a batch boundary
            assert stopped.lease_id is None and stopped.error_code == ""
            time.sleep(6)  # three ticks of the test's beat: a paused job is not claimed again
            again = ae.job(ns, job.id)
            assert (again.state, again.batches) == (JobState.PENDING, stopped.batches)
            with platform_engine.connect() as conn:
                audit = conn.execute(
                    select(audit_events).where(audit_events.c.action == "archive.pause")
                ).one()
            assert audit.actor == "operator"
            driver.get(base + page)
            waiting = "[data-field='waiting']"
            until(lambda: driver.find_element(By.CSS_SELECTOR, waiting).text == "paused", 30,
                  "waiting paused on the page")  # fmt: skip
            driver.get(base + "/")
            screenshot(driver, "fleet")

            # --- the viewer: every page, no action, a forged POST refused -----------------
            driver.delete_all_cookies()
            browser_sign_in(driver, base, "viewer", PASSWORDS["viewer"])
            for name, path in pages.items():
                driver.get(base + path)
                assert "Signed in as" in driver.page_source, (name, driver.page_source[:500])
                assert not driver.find_elements(By.CSS_SELECTOR, "form[action^='/controls']")
                _no_serious_violations(driver, name)
            audits = _count(platform_engine, audit_events)
            controls = _count(platform_engine, archive_controls)
            driver.get(base + page)
            status = driver.execute_async_script(
                "const done = arguments[arguments.length - 1];"
                "const csrf = document.querySelector('input[name=csrf]').value;"
                "fetch('/controls/resume', {method: 'POST', credentials: 'same-origin',"
                " headers: {'Content-Type': 'application/x-www-form-urlencoded'},"
                " body: 'csrf=' + csrf + '&namespace=acme&kind=events'})"
                ".then(r => done(r.status)).catch(e => done(String(e)));"
            )
            assert status == 403
            assert _count(platform_engine, archive_controls) == controls == 1
            assert _count(platform_engine, audit_events) == audits

            # --- a cross-site form without the CSRF token (the viewer's session is live) ----
            site, root = other_site
            (root / "attack.html").write_text(
                "<!DOCTYPE html><html lang='en'><head><title>x</title></head><body>"
                f"<form id='f' method='post' action='{base}/controls/resume'>"
                "<input name='namespace' value='acme'><input name='kind' value='events'>"
                "</form><script>document.getElementById('f').submit()</script></body></html>"
            )
            driver.get(site + "/attack.html")
            until(lambda: "Refused" in driver.page_source or "sign in" in driver.page_source,
                  30, "the console's answer")  # fmt: skip
            assert _count(platform_engine, archive_controls) == controls == 1
            assert ae.job(ns, job.id).state is JobState.PENDING

            # --- the operator resumes from the page; the job finishes ---------------------
            for w in ae.workers:
                w.stop()  # while the job waits (no lease): the rest at full speed
            ae.worker("console-fast", [vol])
            driver.delete_all_cookies()
            browser_sign_in(driver, base, "operator", PASSWORDS["operator"])
            driver.get(base + page)
            driver.find_element(
                By.CSS_SELECTOR, "form[aria-label='Resume acme/events'] button"
            ).click()
            until(lambda: "resume: namespace acme, kind events" in driver.page_source, 30,
                  "the resume's result")  # fmt: skip
            done = wait_state(ae, job, {JobState.SUCCEEDED, JobState.FAILED}, timeout=300)
            assert done.state is JobState.SUCCEEDED, done
            driver.get(base + page)
            until(lambda: driver.find_element(By.CSS_SELECTOR, "[data-field='state']").text
                  == "SUCCEEDED", 30, "SUCCEEDED on the page")  # fmt: skip
            driver.get(base + "/audit?actor=operator")  # the audit log, filtered by who
            assert "archive.pause" in driver.page_source and "archive.resume" in driver.page_source
            for name, path in pages.items():
                driver.get(base + path)
                _no_serious_violations(driver, f"{name} (operator)")
                if name in ("plans", "jobs", "audit"):
                    screenshot(driver, name)
            driver.delete_all_cookies()
            driver.get(base + "/login")
            _no_serious_violations(driver, "login")
        stop.set()
        beat.join(timeout=30)


@pytest.mark.parametrize("business_db", ["mariadb"], indirect=True)
def test_dead_letters_requeued_in_bulk_from_the_page_are_accepted(
    world: World, business_db: tuple[str, Engine], workers: Workers, beat: Celery
) -> None:
    url, engine = business_db
    ns, other = world.ns, world.queues[1]
    ops = [secrets.token_hex(16) for _ in range(4)]
    with engine.begin() as conn:
        for i, op in enumerate(ops):
            enqueue(conn, namespace_id=ns, queue_id=other, operation_id=op, request=body_for(i),
                    source_ref=f"orders/{op[:8]}")  # fmt: skip
    o = sender_outbox.c

    def states() -> set[str]:
        with engine.connect() as conn:
            return {r.state for r in conn.execute(select(o.state).where(o.namespace_id == ns))}

    # a sender whose credential allows only queues[0]: every row goes to REVIEW QUEUE_FORBIDDEN
    first = workers.start(
        "sender-q0", celery_env(url, world.platform_url, world.api.base_url, world.token_q0)
    )
    end = time.monotonic() + 60
    while states() != {"REVIEW"}:
        assert time.monotonic() < end, states()
        beat.send_task("orbit.sender.tick", queue="orbit.sender", expires=5)
        time.sleep(0.5)
    workers.kill(first)
    env = {**orbit_env(world.platform_url, url), "CELERY_BROKER_URL": REDIS_URL}
    add_people(env)
    with running_console(env) as console, browser() as driver:
        browser_sign_in(driver, console.base_url, "operator", PASSWORDS["operator"])
        driver.get(console.base_url + "/dead-letters?code=QUEUE_FORBIDDEN")
        assert driver.page_source.count(ns) >= len(ops)
        _no_serious_violations(driver, "dead letters of a code")
        driver.find_element(By.CSS_SELECTOR, "form[aria-label='preview requeue'] button").click()
        until(lambda: "dry run: 4 would_requeue; nothing changed" in driver.page_source, 30,
              "the preview")  # fmt: skip
        _no_serious_violations(driver, "preview")
        screenshot(driver, "dead-letters-preview")
        assert states() == {"REVIEW"}  # the preview wrote nothing
        driver.find_element(By.CSS_SELECTOR, "form[aria-label='confirm requeue'] button").click()
        until(lambda: "4 requeued" in driver.page_source, 30, "the requeue's result")
        assert states() == {"PENDING"}
        workers.start(
            "sender", celery_env(url, world.platform_url, world.api.base_url, world.token)
        )
        end = time.monotonic() + 60
        while states() != {"ACCEPTED"}:
            assert time.monotonic() < end, states()
            beat.send_task("orbit.sender.tick", queue="orbit.sender", expires=5)
            time.sleep(0.5)
        driver.get(console.base_url + "/dead-letters?code=QUEUE_FORBIDDEN")
        assert "no REVIEW rows" in driver.page_source
        driver.get(console.base_url + "/audit?action=sender.requeue.code")
        assert "operator" in driver.page_source and "requeued=4" in driver.page_source
