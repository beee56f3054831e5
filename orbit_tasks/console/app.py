"""The operator console (issue 29, docs/console.md): FastAPI app factory ``create_app``.

Server-rendered pages and one small script (the job page's live progress) shipped in
``static/``. Every number comes from the functions the CLI (or the exporter) reads it with, and
every action is the store call the CLI makes: one transaction with its audit row, naming the
signed-in person; the page shows what the database returned.

Access: no anonymous page; a session cookie (HttpOnly, SameSite=Strict) whose SHA-256 is a row
of ``orbit_console_sessions``; every POST needs the session's CSRF token and, when the browser
sends one, an ``Origin`` of this server; a viewer's POST is refused (403) before anything is
read or written.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from sqlalchemy import Engine

from orbit_tasks.archive import controls as control_rules
from orbit_tasks.archive.controls import ControlKind, Scope
from orbit_tasks.archive.jobs import ErrorCode, Job, JobFailure, JobState
from orbit_tasks.archive.ranges import ArchiveRange
from orbit_tasks.archive.store import controls as control_store
from orbit_tasks.archive.store import jobs as job_store
from orbit_tasks.archive.store import plans as plan_store
from orbit_tasks.archive.store.controls import PLATFORM_NAMESPACE
from orbit_tasks.console import access
from orbit_tasks.console import pages as p
from orbit_tasks.console import store as console_store
from orbit_tasks.console.access import Role
from orbit_tasks.console.fleet import FleetReader
from orbit_tasks.db.engine import DB_CLOCK, Clock
from orbit_tasks.error_lines import describe_error
from orbit_tasks.errors import InvalidInput, NotFound, OrbitError
from orbit_tasks.ids import from_hex
from orbit_tasks.logs import log_action
from orbit_tasks.metrics.families import Snapshot
from orbit_tasks.platform.history import HISTORY_KINDS, history_kind
from orbit_tasks.platform.store import (
    get_namespace,
    insert_audit,
    list_namespaces,
    list_storages,
    resolve_namespace,
    storage_exists,
)
from orbit_tasks.sender import policy as sender_policy
from orbit_tasks.sender import review as sender_review
from orbit_tasks.sender.store import dead_letters
from orbit_tasks.settings import Settings
from orbit_tasks.timestamps import format_optional, format_ts
from orbit_tasks.units import format_size, parse_size

log = logging.getLogger("orbit.console.app")

STATIC = Path(__file__).resolve().parent / "static"
STATIC_FILES = {"console.css": "text/css", "console.js": "text/javascript"}
RUNBOOK_FILE = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
PAGE_ROWS = 50
RANGES_KEPT = 10_000  # job ranges kept in memory (each is fixed once derived)
FINAL = (JobState.SUCCEEDED, JobState.FAILED, JobState.ABANDONED)
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
STATUS = {2: 400, 3: 409, 4: 404}
LOGIN_COOKIE = "orbit_console_login"
REVIEW_CODES = sorted(sender_policy.REVIEW_CODES)


class SignIn(Exception):
    """No live session: a page goes to the sign-in page, the JSON answers 401."""


class Refused(Exception):
    """A POST the server refuses (403): no CSRF token, a foreign Origin, or a viewer."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class Person:
    """The signed-in person of a request: name, role and the session's CSRF token."""

    def __init__(self, user: console_store.User, session_id: str) -> None:
        self.name = user.name
        self.role = user.role
        self.session_id = session_id
        self.csrf = access.csrf_token(session_id)

    @property
    def who(self) -> tuple[str, Role]:
        return self.name, self.role


def create_app(
    platform: Engine,
    business: Engine | None,
    settings: Settings,
    *,
    fleet: FleetReader | None = None,
    clock: Clock = DB_CLOCK,
    runbook: str = "/runbook",
    wake: Callable[[Job], None] | None = None,
    wake_tick: Callable[[], None] | None = None,
) -> FastAPI:
    """The console on the platform database (and the business database of the dead letters,
    when the sender is configured). ``fleet`` reads the fleet page's numbers (the exporter's
    sources); ``wake``/``wake_tick`` publish a job's or the tick's wake-up (best effort)."""
    reader = fleet or FleetReader.from_settings(settings, platform)
    dummy_hash = access.hash_secret(access.new_session_id())
    ranges: dict[tuple[bytes, bytes], ArchiveRange | None] = {}

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        reader.start()  # the fleet's snapshot is kept fresh in the background
        try:
            yield
        finally:
            reader.stop()

    app = FastAPI(
        title="orbit console", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan
    )

    def now_of(conn: Any) -> Any:
        return clock.now(conn)

    # --- access ----------------------------------------------------------------------------

    def person_of(request: Request) -> Person | None:
        sid = request.cookies.get(access.COOKIE)
        if not sid or len(sid) > 128:
            return None
        with platform.connect() as conn:
            user = console_store.session_user(conn, access.session_digest(sid), now_of(conn))
        return None if user is None else Person(user, sid)

    def viewer(request: Request) -> Person:
        person = person_of(request)
        if person is None:
            raise SignIn()
        return person

    async def posted(request: Request, *, act: bool = True) -> tuple[Person, dict[str, str]]:
        """The person and form of a POST, after every check of item 4 (nothing read or
        written before they pass)."""
        person = person_of(request)
        if person is None:
            raise SignIn()
        form = await form_of(request)
        if not access.origin_ok(request.headers.get("origin"), request.headers.get("host")):
            refuse(request, person, "the request came from another site (Origin)")
        if not access.csrf_ok(person.session_id, form.get(access.CSRF_FIELD)):
            refuse(request, person, "the form's CSRF token is missing or wrong")
        if act and not access.may_act(person.role):
            refuse(request, person, "a viewer may not act; ask an operator")
        return person, form

    def refuse(request: Request, person: Person | None, why: str) -> None:
        log_action(
            log, "console.action.refused", logging.WARNING, user=person.name if person else None,
            path=request.url.path, why=why,
        )  # fmt: skip
        raise Refused(why)

    @app.exception_handler(SignIn)
    async def _sign_in(request: Request, exc: SignIn) -> Response:
        if request.url.path.startswith("/api/") or request.method == "POST":
            return JSONResponse({"error": "sign in first"}, status_code=401, headers=HEADERS)
        return RedirectResponse("/login", status_code=303, headers=HEADERS)

    @app.exception_handler(Refused)
    async def _refused(request: Request, exc: Refused) -> Response:
        body = p.message(f"refused: {exc.why}; nothing was changed", ok=False)
        return html("Refused", body, None, status=403)

    @app.exception_handler(OrbitError)
    async def _orbit_error(request: Request, exc: OrbitError) -> Response:
        return error_page(request, exc)

    def error_page(request: Request, exc: Exception) -> Response:
        text, code = describe_error(exc)
        person = person_of(request)
        body = p.message(f"error: {text}", ok=False) + back(request)
        return html("Refused" if code in STATUS else "Error", body, person, STATUS.get(code, 500))

    def back(request: Request) -> str:
        ref = request.headers.get("referer", "")
        host = request.headers.get("host", "")
        if ref.startswith((f"http://{host}/", f"https://{host}/")):
            return f"<p>{p.link(ref, 'Back')}</p>"
        return f"<p>{p.link('/', 'Back to the fleet')}</p>"

    def html(
        title: str, body: str, person: Person | None, status: int = 200, **kw: Any
    ) -> HTMLResponse:
        page = p.layout(
            title, body, person=None if person is None else person.who,
            csrf=None if person is None else person.csrf, **kw,
        )  # fmt: skip
        return HTMLResponse(page, status_code=status, headers=HEADERS)

    def act_form(person: Person, action: str, button: str, fields: str = "", **hidden: Any) -> str:
        """An action's form, shown to operators only (the server refuses viewers anyway)."""
        if not access.may_act(person.role):
            return ""
        return p.form(action, person.csrf, fields, button, label=button, hidden=hidden)

    @app.get("/healthz")
    def healthz() -> Response:
        return JSONResponse({"ok": True}, headers=HEADERS)

    # --- sign in and out -------------------------------------------------------------------

    @app.get("/login")
    def login_page(request: Request) -> Response:
        token = access.new_session_id()
        response = html("Sign in", login_form(token), None)
        set_cookie(request, response, LOGIN_COOKIE, token, max_age=600)
        return response

    def login_form(token: str, note: str = "") -> str:
        return (
            note + '<form method="post" action="/login" aria-label="sign in">'
            f'<input type="hidden" name="{access.CSRF_FIELD}" value="{p.e(token)}">'
            '<p><label>Name <input type="text" name="name" autocomplete="username" required>'
            '</label></p><p><label>Password <input type="password" name="password" '
            'autocomplete="current-password" required></label></p>'
            '<button type="submit">Sign in</button></form>'
        )

    @app.post("/login")
    async def login(request: Request) -> Response:
        form = await form_of(request)
        name = form.get("name", "")[:64]
        token = request.cookies.get(LOGIN_COOKIE)
        sent = form.get(access.CSRF_FIELD)
        if (
            not token
            or sent != token
            or not access.origin_ok(request.headers.get("origin"), request.headers.get("host"))
        ):
            refuse(request, None, "the sign-in form's token is missing or wrong")
        with platform.connect() as conn:
            user = console_store.get_user(conn, name)
        # an unknown name costs one scrypt too: the answer's time does not tell who exists
        stored = dummy_hash if user is None else user.secret_hash
        ok = access.check_secret(form.get("password", ""), stored) and user is not None
        if not ok or user is None:
            log_action(
                log, "console.login.failed", logging.WARNING, user=name,
                client=request.client.host if request.client else None,
            )  # fmt: skip
            note = p.message("wrong name or password", ok=False)
            fresh = access.new_session_id()
            response = html("Sign in", login_form(fresh, note), None, status=401)
            set_cookie(request, response, LOGIN_COOKIE, fresh, max_age=600)
            return response
        sid = access.new_session_id()
        with platform.begin() as conn:
            console_store.open_session(
                conn, access.session_digest(sid), user.name, now_of(conn), access.SESSION_SECONDS
            )
        log_action(log, "console.login", user=user.name, role=user.role.value)
        moved = RedirectResponse("/", status_code=303, headers=HEADERS)
        set_cookie(request, moved, access.COOKIE, sid, max_age=access.SESSION_SECONDS)
        moved.delete_cookie(LOGIN_COOKIE, path="/")
        return moved

    @app.post("/logout")
    async def logout(request: Request) -> Response:
        person, _ = await posted(request, act=False)
        with platform.begin() as conn:
            console_store.close_session(conn, access.session_digest(person.session_id))
        response = RedirectResponse("/login", status_code=303, headers=HEADERS)
        response.delete_cookie(access.COOKIE, path="/")
        return response

    # --- static files and the runbook ------------------------------------------------------

    @app.get("/static/{name}")
    def static(name: str) -> Response:
        if name not in STATIC_FILES:
            return Response("not found", status_code=404)
        return FileResponse(STATIC / name, media_type=STATIC_FILES[name], headers=HEADERS)

    @app.get("/runbook")
    def runbook_page(request: Request) -> Response:
        person = viewer(request)
        if not RUNBOOK_FILE.exists():
            body = p.message("docs/operations.md is not installed beside this console", ok=False)
            return html("Runbook", body, person, status=404)
        return html("Runbook", p.markdown_sections(RUNBOOK_FILE.read_text("utf-8")), person)

    # --- the fleet -------------------------------------------------------------------------

    @app.get("/")
    def fleet_page(request: Request) -> Response:
        person = viewer(request)
        started = time.monotonic()
        try:
            reading = reader.read()
        except Exception as exc:  # the exporter's sources could not be built (schema, broker)
            log_action(log, "console.fleet.unavailable", logging.WARNING, error=type(exc).__name__)
            reading = Snapshot(platform=None, business=None, broker=None, business_configured=False)
        with platform.connect() as conn:
            now = now_of(conn)
            storages = list_storages(conn)
            controls = control_store.list_controls(conn)
            names = {n.id: n.name for n in list_namespaces(conn)}
            ids = [bytes.fromhex(s["storage_id"]) for s in storages]
            stalled = console_store.stalled_jobs(conn, ids, now, PAGE_ROWS)
            failed = console_store.failed_jobs(conn, ids, PAGE_ROWS)
        body = p.fleet(
            reading, storages, controls, names, stalled, failed, runbook=runbook,
            flags=FleetReader.unserved(reading),
            controls_form=controls_forms(person),
        )  # fmt: skip
        body += f'<p class="timing">read in {time.monotonic() - started:.3f} s</p>'
        return html("Fleet", body, person)

    def controls_forms(person: Person) -> str:
        if not access.may_act(person.role):
            return ""
        scope = (
            p.text_input("storage", "Storage id")
            + p.text_input("namespace", "Namespace")
            + p.text_input("kind", "Kind")
        )
        return (
            "<h2>Change a control</h2>"
            + act_form(person, "/controls/pause", "Pause", scope + p.text_input("reason", "Reason"))
            + act_form(person, "/controls/resume", "Resume", scope)
            + act_form(
                person,
                "/controls/throttle",
                "Throttle",
                scope + p.text_input("rate", "Roots per second (empty: clear)"),
            )  # fmt: skip
            + act_form(
                person,
                "/controls/window",
                "Set windows",
                scope + p.text_input("windows", "Windows, e.g. 01:00-06:00 (empty: clear)"),
            )  # fmt: skip
        )

    # --- plans -----------------------------------------------------------------------------

    @app.get("/plans")
    def plans_page(
        request: Request, namespace: str = "", kind: str = "", storage: str = "", after: str = ""
    ) -> Response:
        person = viewer(request)
        with platform.connect() as conn:
            ns_id = resolve_namespace(conn, namespace).id if namespace else None
            if kind:
                history_kind(kind)
            storage_id = from_hex(storage, "storage id") if storage else None
            names = {n.id: n.name for n in list_namespaces(conn)}
            plans = [
                pl
                for pl in plan_store.list_plans(conn, ns_id)
                if (not kind or pl.kind == kind)
                and (storage_id is None or pl.storage_id == storage_id)
            ]
            plans.sort(key=lambda pl: (pl.namespace_id, pl.kind))
            if after:
                plans = [pl for pl in plans if f"{pl.namespace_id.hex()}:{pl.kind}" > after]
            page, more = plans[:PAGE_ROWS], len(plans) > PAGE_ROWS
            latest = {
                (pl.namespace_id, pl.kind): plan_store.latest_policy_revision(
                    conn, pl.namespace_id, pl.kind
                )
                for pl in page
            }
        rows = []
        for pl in page:
            ns_name = names.get(pl.namespace_id, pl.namespace_id.hex())
            confirmed = latest[(pl.namespace_id, pl.kind)] == pl.policy_revision
            job = (
                p.link(f"/jobs/{ns_name}/{pl.active_job_id.hex()}", pl.active_job_id.hex())
                if pl.active_job_id
                else "-"
            )
            rows.append(
                [
                    p.e(ns_name), p.e(pl.kind), p.e(pl.revision),
                    "yes" if pl.enabled else "no", p.e(pl.storage_id.hex()),
                    p.e(pl.interval_seconds), p.e(format_ts(pl.next_run_at)),
                    "yes" if confirmed else '<span class="flag">UNCONFIRMED</span>', job,
                    act_form(person, f"/plans/{ns_name}/{pl.kind}/run", "Run now"),
                ]
            )  # fmt: skip
        nxt = f"{page[-1].namespace_id.hex()}:{page[-1].kind}" if more and page else None
        body = (
            p.filters(
                "/plans",
                p.text_input("namespace", "Namespace", namespace)
                + p.select_input("kind", "Kind", list(HISTORY_KINDS), kind or None)
                + p.text_input("storage", "Storage id", storage),
            )
            + p.table(
                [
                    "namespace",
                    "kind",
                    "revision",
                    "enabled",
                    "storage",
                    "interval (s)",
                    "next run",
                    "policy confirmed",
                    "active job",
                    "action",
                ],
                rows,
                caption="Plans",
            )  # fmt: skip
            + p.pager("/plans", nxt, namespace=namespace, kind=kind, storage=storage)
        )
        return html("Plans", body, person)

    @app.post("/plans/{ns}/{kind}/run")
    async def plan_run(request: Request, ns: str, kind: str) -> Response:
        person, _ = await posted(request)
        with platform.begin() as conn:
            namespace = resolve_namespace(conn, ns)
            result = plan_store.run_plan(
                conn, namespace.id, kind, now=now_of(conn), actor=person.name
            )
        log_action(log, "archive.plan.run", namespace_id=namespace.id, kind=kind, user=person.name)
        woken = best_effort(wake_tick)
        text = (
            f"plan {namespace.name}/{kind} is due now (next_run_at "
            f"{format_ts(result.plan.next_run_at)}); "
            + ("the tick was woken" if woken else "the next tick (beat) creates its job")
            + f"; the next scheduled run stays {format_optional(result.next_scheduled)}"
        )
        return done(person, "Plan run", text, "/plans")

    def best_effort(fn: Callable[[], None] | None) -> bool:
        if fn is None:
            return False
        try:
            fn()
            return True
        except Exception as exc:  # the broker is down: beat's next tick does it anyway
            log_action(log, "console.wakeup_failed", logging.WARNING, error=type(exc).__name__)
            return False

    def done(person: Person, title: str, text: str, back_to: str, extra: str = "") -> Response:
        body = p.message(text, ok=True) + extra + f"<p>{p.link(back_to, 'Back')}</p>"
        return html(title, body, person)

    # --- jobs ------------------------------------------------------------------------------

    @app.get("/jobs")
    def jobs_page(
        request: Request,
        namespace: str = "",
        kind: str = "",
        state: str = "",
        storage: str = "",
        after: str = "",
    ) -> Response:
        person = viewer(request)
        with platform.connect() as conn:
            spaces = list_namespaces(conn)
            if not namespace:
                rows = [
                    [p.link(p.url("/jobs", namespace=n.name), n.name), p.e(n.state)] for n in spaces
                ]
                body = p.table(["namespace", "state"], rows, caption="Choose a namespace")
                return html("Jobs", body, person)
            ns = resolve_namespace(conn, namespace)
            if kind:
                history_kind(kind)
            if state and state not in JobState.__members__:
                allowed = ", ".join(s.value for s in JobState)
                raise InvalidInput(f"state {state!r} is not a job state (allowed: {allowed})")
            job_state = JobState(state) if state else None
            storage_id = from_hex(storage, "storage id") if storage else None
            if kind or storage_id is not None:
                jobs, nxt = console_store.list_jobs(
                    conn, ns.id, state=job_state, kind=kind or None, storage_id=storage_id,
                    limit=PAGE_ROWS, after=after or None,
                )  # fmt: skip
            else:  # the CLI's own query (`orbit job list NS --state S`)
                jobs, nxt = job_store.list_jobs(
                    conn, ns.id, state=job_state, limit=PAGE_ROWS, after=after or None
                )
        rows = [
            [
                p.link(f"/jobs/{ns.name}/{j.id.hex()}", j.id.hex()), p.e(j.kind),
                p.e(j.state.value), error_cell(j), p.e(j.attempts), p.e(j.batches),
                p.e(j.roots), p.e(j.bytes), p.e(j.storage_id.hex()), p.e(format_ts(j.created_at)),
            ]
            for j in jobs
        ]  # fmt: skip
        body = (
            p.filters(
                "/jobs",
                p.text_input("namespace", "Namespace", ns.name)
                + p.select_input("kind", "Kind", list(HISTORY_KINDS), kind or None)
                + p.select_input("state", "State", [s.value for s in JobState], state or None)
                + p.text_input("storage", "Storage id", storage),
            )
            + p.table(
                [
                    "job",
                    "kind",
                    "state",
                    "error",
                    "attempts",
                    "batches",
                    "roots",
                    "bytes",
                    "storage",
                    "created",
                ],
                rows,
                caption=f"Jobs of {ns.name}, oldest first",
            )  # fmt: skip
            + p.pager("/jobs", nxt, namespace=ns.name, kind=kind, state=state, storage=storage)
        )
        return html("Jobs", body, person)

    def error_cell(j: Job) -> str:
        if not j.error_code:
            return "-"
        return p.runbook(runbook, j.error_code)

    def job_view(ns_ref: str, job_ref: str) -> tuple[str, Job, dict[str, Any]]:
        """The job and its live progress: the fields ``orbit job show`` and ``job watch``
        print, read by the same store functions."""
        with platform.connect() as conn:
            ns = resolve_namespace(conn, ns_ref)
            job = job_store.require_job(conn, ns.id, from_hex(job_ref, "job id"))
            now = now_of(conn)
            waits = control_store.job_waits(conn, ns.id, job.id)
            key = (ns.id, job.id)
            if key in ranges:
                rng: ArchiveRange | None = ranges[key]
            else:
                try:
                    rng = job_store.job_range(conn, job)
                except JobFailure:
                    rng = None
                # a range is fixed once its end is (a cut is recorded before the first batch):
                # derived once, then kept
                if job.batches > 0 or job.state in FINAL:
                    if len(ranges) >= RANGES_KEPT:
                        ranges.clear()
                    ranges[key] = rng
            end = job_store.recorded_end(conn, ns.id, job.id)
        total = None if end is None else end.roots_total
        final = job.state in FINAL
        stop = job.updated_at if final else now
        elapsed = max(0.0, (stop - job.created_at).total_seconds())
        totals = control_rules.wait_totals(waits, now, open_counts=job.state is JobState.PENDING)
        rate = control_rules.roots_per_second(job.roots, elapsed)
        eta = None
        if rate and total is not None and not final:
            eta = max(0.0, (total - job.roots) / rate)
        waited = ", ".join(f"{r.value} {v:.1f}s" for r, v in totals.seconds.items() if v) or "none"
        waiting = totals.waiting.value if totals.waiting else "-"
        fields = {
            "state": job.state.value + (f" ({job.error_code})" if job.error_code else ""),
            "roots": f"{job.roots} of {'?' if total is None else total}",
            "rate": "-" if rate is None else f"{rate:.1f} roots/s",
            "eta": "-" if eta is None else f"{eta:.0f} s",
            "waits": waited,
            "waiting": waiting,
            "attempts": str(job.attempts),
            "files": str(job.batches + (1 if job.last_sha256 else 0)),
            "bytes": f"{job.bytes} ({format_size(job.bytes)})",
            "range": "-"
            if rng is None
            else f"{format_optional(rng.from_) or '(start)'} .. {format_ts(rng.until)}",
            "revision": str(job.revision),
            "lease_until": format_optional(job.lease_until) or "-",
        }
        data = {
            "state": job.state.value,
            "roots": job.roots,
            "roots_total": total,
            "now": format_ts(now),
            "fields": fields,
        }
        return ns.name, job, data

    @app.get("/api/jobs/{ns}/{job}")
    def job_json(request: Request, ns: str, job: str) -> Response:
        viewer(request)
        _, _, data = job_view(ns, job)
        return JSONResponse(data, headers=HEADERS)

    @app.get("/jobs/{ns}/{job}")
    def job_page(request: Request, ns: str, job: str) -> Response:
        person = viewer(request)
        ns_name, j, data = job_view(ns, job)
        with platform.connect() as conn:
            history, _ = console_store.audit_page(
                conn, namespace_id=j.namespace_id, target_id=j.id.hex(), limit=PAGE_ROWS
            )
        fields = data["fields"]
        items = [(k, p.e(v)) for k, v in fields.items()]
        total = data["roots_total"]
        bar = (
            f'<p><label for="progress">progress</label> <progress id="progress" '
            f'max="{total or 1}" value="{j.roots if total else 0}"></progress></p>'
        )
        code = ""
        if j.error_code:
            code = f"<p>Error code {p.runbook(runbook, j.error_code)}: see its runbook.</p>"
        actions = ""
        if j.state is JobState.FAILED:
            actions += act_form(
                person, f"/jobs/{ns_name}/{j.id.hex()}/retry", "Retry",
                p.text_input("max_bytes", "Larger budget (e.g. 256MiB; empty: keep)"),
                expect_revision=j.revision,
            )  # fmt: skip
        if j.state in (JobState.FAILED, JobState.PENDING, JobState.RUNNING):
            actions += act_form(
                person, f"/jobs/{ns_name}/{j.id.hex()}/abandon", "Abandon",
                expect_revision=j.revision,
            )  # fmt: skip
        scope = {"namespace": ns_name, "kind": j.kind}
        actions += act_form(
            person, "/controls/pause", f"Pause {ns_name}/{j.kind}",
            p.text_input("reason", "Reason", "paused from the console"), **scope,
        )  # fmt: skip
        actions += act_form(person, "/controls/resume", f"Resume {ns_name}/{j.kind}", **scope)
        audit_rows = [
            [p.e(format_ts(a.created_at)), p.e(a.actor), p.e(a.action), p.e(detail_text(a.detail))]
            for a in history
        ]
        body = (
            f'<section data-poll="/api/jobs/{p.e(ns_name)}/{p.e(j.id.hex())}" aria-live="polite">'
            f"<p>Job {p.e(j.id.hex())} of {p.link(p.url('/jobs', namespace=ns_name), ns_name)}, "
            f"kind {p.e(j.kind)}, storage {p.e(j.storage_id.hex())}; updated "
            f'<span id="updated">{p.e(data["now"])}</span></p>'
            f"{bar}{p.definition_list(items, ids=True)}</section>{code}"
            + (f"<h2>Actions</h2>{actions}" if actions else "")
            + p.table(["when", "who", "action", "detail"], audit_rows, caption="Audit history")
        )
        return html(f"Job {j.id.hex()[:12]}", body, person, scripts=["console.js"])

    @app.post("/jobs/{ns}/{job}/retry")
    async def job_retry(request: Request, ns: str, job: str) -> Response:
        person, form = await posted(request)
        max_bytes = form.get("max_bytes", "").strip()
        budget = parse_size(max_bytes, what="max_bytes") if max_bytes else None
        expect = revision_of(form)
        with platform.connect() as conn:
            namespace = resolve_namespace(conn, ns)
        after = job_store.retry(
            platform, namespace.id, from_hex(job, "job id"), actor=person.name,
            max_bytes=budget, expect_revision=expect,
        )  # fmt: skip
        log_action(log, "archive.job.retried", namespace_id=namespace.id, job_id=after.id,
                   max_bytes=after.max_bytes, user=person.name)  # fmt: skip
        best_effort(None if wake is None else (lambda: wake(after)))
        text = (
            f"job {after.id.hex()} is {after.state.value} (revision {after.revision}, "
            f"max_bytes {after.max_bytes})"
        )
        return done(person, "Job retried", text, f"/jobs/{namespace.name}/{after.id.hex()}")

    @app.post("/jobs/{ns}/{job}/abandon")
    async def job_abandon(request: Request, ns: str, job: str) -> Response:
        person, form = await posted(request)
        with platform.connect() as conn:
            namespace = resolve_namespace(conn, ns)
        after = job_store.abandon(
            platform, namespace.id, from_hex(job, "job id"), actor=person.name,
            expect_revision=revision_of(form),
        )  # fmt: skip
        log_action(log, "archive.job.abandoned", namespace_id=namespace.id, job_id=after.id,
                   user=person.name)  # fmt: skip
        text = f"job {after.id.hex()} is {after.state.value} (revision {after.revision})"
        return done(person, "Job abandoned", text, f"/jobs/{namespace.name}/{after.id.hex()}")

    def revision_of(form: dict[str, str]) -> int | None:
        raw = form.get("expect_revision", "").strip()
        if not raw:
            return None
        if not raw.isdigit():
            raise InvalidInput(f"expect_revision {raw!r} is not a revision (0..2^63)")
        return int(raw)

    # --- controls --------------------------------------------------------------------------

    def scope_of(conn: Any, form: dict[str, str], *, kind_allowed: bool = True) -> Scope:
        storage = form.get("storage", "").strip() or None
        namespace = form.get("namespace", "").strip() or None
        kind = form.get("kind", "").strip() or None
        if kind is not None and not kind_allowed:
            raise InvalidInput(
                "a throttle or a window is set on a storage or a namespace, not a kind"
            )
        if kind is not None and namespace is None:
            raise InvalidInput(f"kind {kind!r} needs a namespace (a kind is one namespace's)")
        storage_id = ns_id = None
        if storage is not None:
            storage_id = from_hex(storage, "storage id")
            if not storage_exists(conn, storage_id):
                raise NotFound(f"storage {storage} is not registered (see the fleet page)")
        if namespace is not None:
            ns_id = resolve_namespace(conn, namespace).id
        if kind is not None:
            history_kind(kind)
        return Scope(storage_id, ns_id, kind)

    def one_of(scope: Scope) -> None:
        if (scope.storage_id is None) == (scope.namespace_id is None):
            raise InvalidInput("give exactly one of a storage id or a namespace")

    async def change_control(
        request: Request, build: Callable[[Any, dict[str, str]], Any]
    ) -> Response:
        person, form = await posted(request)
        with platform.connect() as conn:
            change, what = build(conn, form)
        with platform.begin() as conn:
            changed = control_store.change(conn, change, actor=person.name, clock=clock)
        scope = describe_scope(change.scope)
        if not changed:
            text = f"{scope}: nothing to {what} (no such control in force); nothing changed"
        else:
            text = f"{what}: {scope} (by {person.name})"
        return done(person, "Controls", text, "/")

    def describe_scope(scope: Scope) -> str:
        if scope.is_everything:
            return "everything"
        parts = []
        if scope.storage_id is not None:
            parts.append(f"storage {scope.storage_id.hex()}")
        if scope.namespace_id is not None:
            with platform.connect() as conn:
                ns = get_namespace(conn, scope.namespace_id)
            parts.append(f"namespace {ns.name if ns else scope.namespace_id.hex()}")
        if scope.kind is not None:
            parts.append(f"kind {scope.kind}")
        return ", ".join(parts)

    @app.post("/controls/pause")
    async def pause(request: Request) -> Response:
        def build(conn: Any, form: dict[str, str]) -> Any:
            reason = control_rules.validate_reason(form.get("reason", ""))
            change = control_store.Change(ControlKind.PAUSE, scope_of(conn, form), reason=reason)
            return change, "pause"

        return await change_control(request, build)

    @app.post("/controls/resume")
    async def resume(request: Request) -> Response:
        def build(conn: Any, form: dict[str, str]) -> Any:
            return control_store.Change(
                ControlKind.PAUSE, scope_of(conn, form), clear=True
            ), "resume"

        return await change_control(request, build)

    @app.post("/controls/throttle")
    async def throttle(request: Request) -> Response:
        def build(conn: Any, form: dict[str, str]) -> Any:
            scope = scope_of(conn, form, kind_allowed=False)
            one_of(scope)
            raw = form.get("rate", "").strip()
            if not raw:
                return control_store.Change(
                    ControlKind.THROTTLE, scope, clear=True
                ), "throttle clear"
            rate = control_rules.validate_rate(raw)
            change = control_store.Change(ControlKind.THROTTLE, scope, max_roots_per_second=rate)
            return change, f"throttle to {rate} roots/s"

        return await change_control(request, build)

    @app.post("/controls/window")
    async def window(request: Request) -> Response:
        def build(conn: Any, form: dict[str, str]) -> Any:
            scope = scope_of(conn, form, kind_allowed=False)
            one_of(scope)
            raw = tuple(form.get("windows", "").split())
            if not raw:
                return control_store.Change(ControlKind.WINDOW, scope, clear=True), "window clear"
            parsed = control_rules.parse_windows(raw)
            change = control_store.Change(ControlKind.WINDOW, scope, windows=parsed)
            return change, f"window {control_rules.format_windows(parsed)}"

        return await change_control(request, build)

    # --- dead letters ----------------------------------------------------------------------

    def need_business() -> Engine:
        if business is None:
            raise NotFound("no business database (ORBIT_SENDER_DATABASE_URL): no dead letters")
        return business

    def sender_namespace(ref: str) -> str | None:
        if not ref:
            return None
        with platform.connect() as conn:
            return resolve_namespace(conn, ref).id.hex()

    def check_code(code: str) -> str:
        if code not in sender_policy.REVIEW_CODES:
            raise InvalidInput(
                f"code {code!r} is not a REVIEW code (allowed: {', '.join(REVIEW_CODES)})"
            )
        return code

    @app.get("/dead-letters")
    def dead_letters_page(
        request: Request, code: str = "", namespace: str = "", after: str = ""
    ) -> Response:
        person = viewer(request)
        engine = need_business()
        chooser = p.filters(
            "/dead-letters",
            p.select_input("code", "Code", REVIEW_CODES, code or None)
            + p.text_input("namespace", "Namespace", namespace),
        )
        if not code:
            try:
                reading = reader.review_counts()
            except Exception as exc:
                log_action(log, "console.fleet.unavailable", logging.WARNING,
                           error=type(exc).__name__)  # fmt: skip
                reading = {}
            rows = [
                [p.link(p.url("/dead-letters", code=c), c), p.e(n), p.runbook(runbook, c)]
                for c, n in sorted(reading.items())
            ]
            body = chooser + p.table(
                ["code", "unresolved REVIEW rows", "runbook"], rows,
                caption="Dead letters by code", empty="no REVIEW rows",
            )  # fmt: skip
            return html("Dead letters", body, person)
        check_code(code)
        ns_id = sender_namespace(namespace)
        cursor = None
        if after:
            parts = after.split(":")
            if len(parts) != 2 or not all(sender_policy.is_hex32(x) for x in parts):
                raise InvalidInput(f"after {after!r} must be NS:OP (two 32-hex ids)")
            cursor = (parts[0], parts[1])
        with engine.connect() as conn:
            page = dead_letters.review_page(
                conn, last_code=code, namespace_id=ns_id, after=cursor, limit=PAGE_ROWS + 1,
                unresolved=False,
            )  # fmt: skip
        more = len(page) > PAGE_ROWS
        page = page[:PAGE_ROWS]
        rows = [
            [p.e(r.namespace_id), p.e(r.operation_id), p.e(r.send_count),
             p.e(format_ts(r.send_deadline_at)), p.e(r.resolved_by or "-")]
            for r in page
        ]  # fmt: skip
        nxt = f"{page[-1].namespace_id}:{page[-1].operation_id}" if more and page else None
        bulk = ""
        if access.may_act(person.role):
            hidden = {"code": code, "namespace": namespace}
            bulk = (
                "<h2>Bulk actions</h2><p>Preview first: it lists every row the action touches "
                "and what it would do, and changes nothing.</p>"
                + p.form("/dead-letters/preview", person.csrf, "", "Preview requeue",
                         label="preview requeue", hidden={**hidden, "action": "requeue"})
                + p.form("/dead-letters/preview", person.csrf, p.text_input("reason", "Reason"),
                         "Preview resolve", label="preview resolve",
                         hidden={**hidden, "action": "resolve"})
            )  # fmt: skip
        body = (
            chooser
            + f"<p>Runbook: {p.runbook(runbook, code)}</p>"
            + p.table(
                ["namespace", "operation", "sends", "deadline", "resolved by"],
                rows,
                caption=f"REVIEW rows with code {code}",
                empty="no REVIEW rows",
            )  # fmt: skip
            + p.pager("/dead-letters", nxt, code=code, namespace=namespace)
            + bulk
        )
        return html("Dead letters", body, person)

    def bulk(action: str, code: str, ns_id: str | None, reason: str, actor: str, dry: bool) -> Any:
        engine = need_business()
        if action == "requeue":
            return sender_review.requeue_code(engine, code, ns_id, dry_run=dry)
        if action == "resolve":
            return sender_review.resolve_code(
                engine, code, ns_id, reason=reason, actor=actor, dry_run=dry
            )
        raise InvalidInput(f"action {action!r} is not a bulk action (allowed: requeue, resolve)")

    @app.post("/dead-letters/preview")
    async def dead_letters_preview(request: Request) -> Response:
        person, form = await posted(request)
        action, code = form.get("action", ""), check_code(form.get("code", ""))
        namespace, reason = form.get("namespace", ""), form.get("reason", "")
        items = bulk(action, code, sender_namespace(namespace), reason, person.name, True)
        confirm = p.form(
            f"/dead-letters/{action}", person.csrf, "", f"{action.capitalize()} these rows",
            label=f"confirm {action}",
            hidden={"code": code, "namespace": namespace, "reason": reason},
        )  # fmt: skip
        body = (
            p.message(f"dry run: {summary(items)}; nothing changed", ok=True)
            + items_table(items, f"What {action} --code {code} would do")
            + confirm
        )
        return html("Preview", body, person)

    @app.post("/dead-letters/{action}")
    async def dead_letters_act(request: Request, action: str) -> Response:
        person, form = await posted(request)
        code, namespace = check_code(form.get("code", "")), form.get("namespace", "")
        reason = form.get("reason", "")
        ns_id = sender_namespace(namespace)
        items = bulk(action, code, ns_id, reason, person.name, False)
        counts = tally(items)
        with platform.begin() as conn:  # the console's audit row of the bulk action
            insert_audit(
                conn, PLATFORM_NAMESPACE, actor=person.name, action=f"sender.{action}.code",
                target_kind="outbox_code", target_id=code,
                detail={"namespace_id": ns_id, **counts},
            )  # fmt: skip
        text = f"{action} --code {code}: {summary(items)}"
        return done(person, "Dead letters", text, p.url("/dead-letters", code=code),
                    items_table(items, f"{action} --code {code}"))  # fmt: skip

    def tally(items: list[dict[str, Any]]) -> dict[str, int]:
        counts: dict[str, int] = {}
        for item in items:
            counts[item["action"]] = counts.get(item["action"], 0) + 1
        return counts

    def summary(items: list[dict[str, Any]]) -> str:
        return ", ".join(f"{n} {a}" for a, n in sorted(tally(items).items())) or "no rows"

    def items_table(items: list[dict[str, Any]], caption: str) -> str:
        rows = [
            [p.e(i["namespace_id"]), p.e(i["operation_id"]), p.e(i["send_count"]),
             p.e(i["action"]), p.e(i["why"])]
            for i in items
        ]  # fmt: skip
        return p.table(["namespace", "operation", "sends", "action", "why"], rows, caption=caption)

    # --- the audit log ---------------------------------------------------------------------

    @app.get("/audit")
    def audit_page(
        request: Request,
        namespace: str = "",
        actor: str = "",
        action: str = "",
        target: str = "",
        after: str = "",
    ) -> Response:
        person = viewer(request)
        with platform.connect() as conn:
            ns_id = None
            if namespace == "platform":
                ns_id = PLATFORM_NAMESPACE
            elif namespace:
                ns_id = resolve_namespace(conn, namespace).id
            rows, nxt = console_store.audit_page(
                conn, namespace_id=ns_id, actor=actor or None, action=action or None,
                target_id=target or None, limit=PAGE_ROWS, after=after or None,
            )  # fmt: skip
            names = {n.id: n.name for n in list_namespaces(conn)}
        names[PLATFORM_NAMESPACE] = "platform"
        table_rows = [
            [
                p.e(format_ts(a.created_at)), p.e(a.actor), p.e(a.action),
                p.e(names.get(a.namespace_id, a.namespace_id.hex())),
                target_cell(a, names), p.e(detail_text(a.detail)),
            ]
            for a in rows
        ]  # fmt: skip
        body = (
            p.filters(
                "/audit",
                p.text_input("namespace", "Namespace (or platform)", namespace)
                + p.text_input("actor", "Who", actor)
                + p.text_input("action", "Action", action)
                + p.text_input("target", "Target id", target),
            )
            + p.table(
                ["when", "who", "action", "namespace", "target", "detail"],
                table_rows,
                caption="Audit log, newest first",
            )  # fmt: skip
            + p.pager("/audit", nxt, namespace=namespace, actor=actor, action=action, target=target)
        )
        return html("Audit log", body, person)

    def target_cell(a: console_store.AuditRow, names: dict[bytes, str]) -> str:
        if a.target_kind == "archive_job" and a.namespace_id in names:
            return p.link(f"/jobs/{names[a.namespace_id]}/{a.target_id}", a.target_id)
        return p.e(f"{a.target_kind} {a.target_id}")

    return app


def detail_text(detail: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(detail.items()))


async def form_of(request: Request) -> dict[str, str]:
    """An urlencoded form (no multipart parser needed): the first value of each field."""
    body = await request.body()
    if len(body) > 64 * 1024:
        raise InvalidInput(f"the form is {len(body)} bytes (allowed 0..65536)")
    try:
        parsed = parse_qs(body.decode("utf-8"), keep_blank_values=True)
    except UnicodeDecodeError:
        raise InvalidInput("the form is not UTF-8") from None
    return {k: v[0] for k, v in parsed.items()}


def set_cookie(request: Request, response: Response, name: str, value: str, max_age: int) -> None:
    response.set_cookie(
        name, value, max_age=max_age, path="/", httponly=True, samesite="strict",
        secure=request.url.scheme == "https",
    )  # fmt: skip


__all__ = ["ErrorCode", "create_app"]
