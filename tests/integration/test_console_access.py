"""The operator console's access (issue 29 item 4), over real HTTP against ``orbit console
serve`` on MariaDB: people made with the CLI and stored hashed, the session cookie, a failed
sign-in logged without the secret, CSRF and Origin checks, a viewer's POST refused (403) with
nothing written, and an operator's action audited under their name."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from orbit_tasks.db.history_tables import audit_events
from orbit_tasks.db.platform_tables import archive_controls, console_sessions, console_users
from tests.support.archive_jobs import ArchiveEnv, make_namespace
from tests.support.console import (
    PASSWORDS,
    Console,
    add_people,
    csrf_of,
    orbit,
    running_console,
    sign_in,
)

pytestmark = [pytest.mark.mariadb, pytest.mark.redis]


@pytest.fixture
def console(ae: ArchiveEnv) -> Iterator[Console]:
    assert orbit(ae.env, "sender", "db", "upgrade").returncode == 0
    add_people(ae.env)
    make_namespace(ae.engine, "acme")
    with running_console(ae.env) as running:
        yield running


def _count(ae: ArchiveEnv, table: Any) -> int:
    with ae.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


def test_people_are_made_with_the_cli_and_stored_hashed(ae: ArchiveEnv) -> None:
    assert orbit(ae.env, "sender", "db", "upgrade").returncode == 0
    secret = "a-long-enough-secret"
    added = orbit(ae.env, "console", "user", "add", "alice", "--role", "operator", stdin=secret)
    assert added.returncode == 0, added.stderr
    with ae.engine.connect() as conn:
        row = conn.execute(select(console_users)).one()
    assert (row.name, row.role) == ("alice", "operator")
    assert secret not in row.secret_hash and row.secret_hash.startswith("scrypt$")
    listed = orbit(ae.env, "console", "user", "list", "--json")
    assert '"name": "alice"' in listed.stdout and "scrypt" not in listed.stdout
    again = orbit(ae.env, "console", "user", "add", "alice", "--role", "viewer", stdin=secret)
    assert again.returncode == 3 and again.stderr.count("\n") == 1, again.stderr
    short = orbit(ae.env, "console", "user", "add", "bob", "--role", "viewer", stdin="short")
    assert short.returncode == 2 and "allowed 12..1024" in short.stderr, short.stderr
    bad_role = orbit(ae.env, "console", "user", "add", "bob", "--role", "admin", stdin=secret)
    assert bad_role.returncode == 2 and "'admin'" in bad_role.stderr
    bad_name = orbit(
        ae.env, "console", "user", "add", "Bob Smith", "--role", "viewer", stdin=secret
    )
    assert bad_name.returncode == 2 and "Traceback" not in bad_name.stderr
    assert _count(ae, console_users) == 1  # nothing written by the refusals
    assert orbit(ae.env, "console", "user", "remove", "nobody").returncode == 4
    assert orbit(ae.env, "console", "user", "remove", "alice").returncode == 0
    assert _count(ae, console_users) == 0
    with ae.engine.connect() as conn:
        actions = [r.action for r in conn.execute(select(audit_events.c.action))]
    assert sorted(actions) == ["console.user.add", "console.user.remove"]


def test_no_anonymous_page(console: Console) -> None:
    for path in ("/", "/plans", "/jobs", "/dead-letters", "/audit", "/runbook"):
        answer = httpx.get(console.base_url + path, follow_redirects=False)
        assert answer.status_code == 303 and answer.headers["location"] == "/login", path
    assert httpx.get(console.base_url + "/api/jobs/acme/" + "0" * 32).status_code == 401
    assert httpx.post(console.base_url + "/controls/pause", data={}).status_code == 401


def test_sign_in_sets_a_strict_http_only_cookie_and_a_failure_is_logged_without_the_secret(
    ae: ArchiveEnv, console: Console
) -> None:
    client = httpx.Client(base_url=console.base_url, follow_redirects=False)
    token = csrf_of(client.get("/login").text)
    wrong = "definitely-not-the-password"
    refused = client.post("/login", data={"csrf": token, "name": "viewer", "password": wrong})
    assert refused.status_code == 401 and "wrong name or password" in refused.text
    assert "console.login.failed" in console.output()
    assert wrong not in console.output()
    assert _count(ae, console_sessions) == 0
    token = csrf_of(refused.text)
    ok = client.post(
        "/login", data={"csrf": token, "name": "viewer", "password": PASSWORDS["viewer"]}
    )
    assert ok.status_code == 303
    cookie = next(h for h in ok.headers.get_list("set-cookie") if h.startswith("orbit_console="))
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    with ae.engine.connect() as conn:
        stored = conn.execute(select(console_sessions.c.session_sha256)).scalar_one()
    assert stored not in cookie  # the table holds its SHA-256, never the cookie
    page = client.get("/")
    assert page.status_code == 200 and "Signed in as <strong>viewer</strong>" in page.text
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    # a sign-in without the form's token is refused
    bare = httpx.post(
        console.base_url + "/login", data={"name": "viewer", "password": PASSWORDS["viewer"]}
    )
    assert bare.status_code == 403


def test_a_viewer_reads_every_page_and_may_not_act(ae: ArchiveEnv, console: Console) -> None:
    viewer = sign_in(console.base_url, "viewer")
    for path in ("/", "/plans", "/jobs", "/jobs?namespace=acme", "/dead-letters", "/audit"):
        answer = viewer.get(path)
        assert answer.status_code == 200, (path, answer.text[:500])
        assert "Pause</button>" not in answer.text  # no action forms for a viewer
    audits, controls = _count(ae, audit_events), _count(ae, archive_controls)
    token = csrf_of(viewer.get("/").text)  # the viewer's own, valid CSRF token
    forged = viewer.post(
        "/controls/pause", data={"csrf": token, "namespace": "acme", "reason": "forged"}
    )
    assert forged.status_code == 403 and "a viewer may not act" in forged.text
    requeue = viewer.post("/dead-letters/requeue", data={"csrf": token, "code": "QUEUE_FORBIDDEN"})
    assert requeue.status_code == 403
    assert (_count(ae, audit_events), _count(ae, archive_controls)) == (audits, controls)
    assert "console.action.refused" in console.output()


def test_csrf_and_origin_refuse_a_cross_site_post(ae: ArchiveEnv, console: Console) -> None:
    operator = sign_in(console.base_url, "operator")
    token = csrf_of(operator.get("/").text)
    form = {"namespace": "acme", "reason": "maintenance"}
    no_token = operator.post("/controls/pause", data=form)
    assert no_token.status_code == 403 and "CSRF" in no_token.text
    wrong = operator.post("/controls/pause", data={**form, "csrf": "0" * 64})
    assert wrong.status_code == 403
    foreign = operator.post(
        "/controls/pause", data={**form, "csrf": token}, headers={"Origin": "http://evil.test"}
    )
    assert foreign.status_code == 403 and "another site" in foreign.text
    assert _count(ae, archive_controls) == 0
    done = operator.post(
        "/controls/pause", data={**form, "csrf": token},
        headers={"Origin": console.base_url},
    )  # fmt: skip
    assert done.status_code == 200, done.text[:1000]
    assert "pause: namespace acme (by operator)" in done.text
    with ae.engine.connect() as conn:
        control = conn.execute(select(archive_controls)).one()
        audit = conn.execute(
            select(audit_events).where(audit_events.c.action == "archive.pause")
        ).one()
    assert (control.actor, control.reason) == ("operator", "maintenance")
    assert audit.actor == "operator"
    # the audit log page shows it, filterable by who
    page = operator.get("/audit", params={"actor": "operator"})
    assert "archive.pause" in page.text
    assert "archive.pause" not in operator.get("/audit", params={"actor": "someone"}).text
    # bad input: one line naming the value and the range, nothing written
    bad = operator.post(
        "/controls/throttle", data={"csrf": token, "namespace": "acme", "rate": "0"}
    )
    assert bad.status_code == 400 and "error:" in bad.text
    assert _count(ae, archive_controls) == 1


def test_sign_out_ends_the_session(ae: ArchiveEnv, console: Console) -> None:
    viewer = sign_in(console.base_url, "viewer")
    token = csrf_of(viewer.get("/").text)
    assert viewer.post("/logout", data={"csrf": token}).status_code == 303
    assert _count(ae, console_sessions) == 0
    assert viewer.get("/").status_code == 303
    # removing a person signs them out at once
    operator = sign_in(console.base_url, "operator")
    assert orbit(ae.env, "console", "user", "remove", "operator").returncode == 0
    assert operator.get("/").status_code == 303
