"""The console's HTML (issue 29): one layout, tables, forms and links, as strings; every value
escaped. No I/O: the routes (``app.py``) pass what the stores returned."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any
from urllib.parse import urlencode

from orbit_tasks.console.access import CSRF_FIELD, Role
from orbit_tasks.queues import queue_name
from orbit_tasks.timestamps import format_optional

NAV = (
    ("/", "Fleet"),
    ("/plans", "Plans"),
    ("/jobs", "Jobs"),
    ("/dead-letters", "Dead letters"),
    ("/audit", "Audit log"),
)


def e(value: Any) -> str:
    """A value as safe HTML text ('-' for None)."""
    return "-" if value is None else escape(str(value), quote=True)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading of docs/operations.md (lowercase, punctuation gone)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def runbook(base: str, heading: str, text: str | None = None) -> str:
    return f'<a href="{e(base)}#{e(anchor(heading))}">{e(text or heading)}</a>'


def link(href: str, text: Any) -> str:
    return f'<a href="{e(href)}">{e(text)}</a>'


def url(path: str, **query: Any) -> str:
    q = {k: v for k, v in query.items() if v not in (None, "")}
    return path + ("?" + urlencode(q) if q else "")


def table(
    headers: Sequence[str], rows: Iterable[Sequence[str]], *, caption: str, empty: str = "none"
) -> str:
    """A table whose cells are HTML already (escape values with :func:`e`)."""
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    if not body:
        body = f'<tr><td colspan="{len(headers)}">{e(empty)}</td></tr>'
    head = "".join(f'<th scope="col">{e(h)}</th>' for h in headers)
    return (
        f"<table><caption>{e(caption)}</caption><thead><tr>{head}</tr></thead>"
        f"<tbody>{body}</tbody></table>"
    )


def form(
    action: str,
    csrf: str,
    fields: str,
    button: str,
    *,
    label: str,
    hidden: Mapping[str, Any] | None = None,
) -> str:
    inputs = "".join(
        f'<input type="hidden" name="{e(k)}" value="{e(v)}">'
        for k, v in (hidden or {}).items()
        if v is not None
    )
    return (
        f'<form method="post" action="{e(action)}" aria-label="{e(label)}">'
        f'<input type="hidden" name="{CSRF_FIELD}" value="{e(csrf)}">{inputs}{fields}'
        f'<button type="submit">{e(button)}</button></form>'
    )


def text_input(name: str, label: str, value: Any = "", *, required: bool = False) -> str:
    req = " required" if required else ""
    return (
        f'<label>{e(label)} <input type="text" name="{e(name)}" '
        f'value="{e("" if value is None else value)}"{req}></label> '
    )


def select_input(name: str, label: str, options: Sequence[str], value: str | None) -> str:
    opts = '<option value="">any</option>' + "".join(
        f'<option value="{e(o)}"{" selected" if o == value else ""}>{e(o)}</option>'
        for o in options
    )
    return f'<label>{e(label)} <select name="{e(name)}">{opts}</select></label> '


def filters(path: str, fields: str) -> str:
    return (
        f'<form method="get" action="{e(path)}" class="filters" aria-label="filters">'
        f'{fields}<button type="submit">Filter</button></form>'
    )


def layout(
    title: str,
    body: str,
    *,
    person: tuple[str, Role] | None,
    csrf: str | None,
    scripts: Sequence[str] = (),
) -> str:
    nav = ""
    if person is not None:
        items = "".join(f"<li>{link(href, text)}</li>" for href, text in NAV)
        out = form("/logout", csrf or "", "", "Sign out", label="sign out")
        nav = (
            f'<nav aria-label="pages"><ul>{items}</ul></nav>'
            f'<p class="who">Signed in as <strong>{e(person[0])}</strong> '
            f"({e(person[1].value)})</p>{out}"
        )
    js = "".join(f'<script src="/static/{e(s)}" defer></script>' for s in scripts)
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{e(title)} - orbit console</title>"
        f'<link rel="stylesheet" href="/static/console.css">{js}</head>'
        f'<body><header><p class="brand">orbit console</p>{nav}</header>'
        f'<main id="main"><h1>{e(title)}</h1>{body}</main></body></html>'
    )


def message(text: str, *, ok: bool) -> str:
    cls = "ok" if ok else "refused"
    role = "status" if ok else "alert"
    return f'<p class="{cls}" role="{role}">{e(text)}</p>'


def pager(path: str, nxt: str | None, **query: Any) -> str:
    if nxt is None:
        return '<p class="pager">last page</p>'
    return f'<p class="pager">{link(url(path, **query, after=nxt), "Next page")}</p>'


def definition_list(items: Iterable[tuple[str, str]], *, ids: bool = False) -> str:
    """``<dl>`` of (term, HTML value); with ``ids`` each value has ``data-field=term``."""
    out = []
    for term, value in items:
        attr = f' data-field="{e(term)}"' if ids else ""
        out.append(f"<dt>{e(term)}</dt><dd{attr}>{value}</dd>")
    return "<dl>" + "".join(out) + "</dl>"


# --- the fleet page (issue 29 item 1) ------------------------------------------------------------


def fleet(
    snap: Any,
    storages: Sequence[Mapping[str, Any]],
    controls: Sequence[Any],
    names: Mapping[bytes, str],
    stalled: Sequence[Any],
    failed: Sequence[Any],
    *,
    flags: Mapping[bytes, int] | None,
    runbook: str,
    controls_form: str,
) -> str:
    """The fleet: storages, jobs per storage, controls, backlogs, and what needs a person;
    ``flags`` is the exporter's unserved flag per storage (None: the broker cannot tell)."""
    plat, broker = snap.platform, snap.broker
    out = []
    if plat is None:
        out.append(
            message("the platform database did not answer in time: numbers unknown", ok=False)
        )
    if broker is None:
        out.append(message("the broker did not answer: workers and queue depths unknown", ok=False))
    rows = []
    for s in storages:
        sid = bytes.fromhex(s["storage_id"])
        queue = queue_name(sid)
        kind = "S3" if s.get("bucket") else "folder"
        where = f"s3://{s['bucket']}/{s['prefix']}" if s.get("bucket") else ""
        workers = (
            "-" if broker is None or broker.consumers is None else broker.consumers.get(queue, 0)
        )
        depth = "-" if broker is None else broker.messages.get(queue, 0)
        jobs = {} if plat is None else _states(plat.jobs, sid)
        flag = "unknown" if flags is None else ("UNSERVED" if flags.get(sid) else "served")
        flag_html = f'<span class="flag">{e(flag)}</span>' if flag == "UNSERVED" else e(flag)
        if flag == "UNSERVED":
            flag_html += " " + runbook_link(runbook, "OrbitStorageUnserved", "runbook")
        expired = "-" if plat is None else plat.leases_expired.get(sid, 0)
        rows.append(
            [
                link(url("/jobs", storage=s["storage_id"]), s["label"] or "(no label)"),
                e(s["storage_id"]),
                e(f"{kind} {where}".strip()),
                e(workers),
                e(depth),
                flag_html,
                e(jobs.get("RUNNING", 0)),
                e(jobs.get("PENDING", 0)),
                e(jobs.get("FAILED", 0)),
                e(expired),
            ]
        )
    out.append(
        table(
            [
                "storage",
                "id",
                "kind",
                "workers serving now",
                "queue depth",
                "served",
                "running",
                "pending",
                "failed",
                "leases expired",
            ],
            rows,
            caption="Storages",
            empty="no storage registered",
        )  # fmt: skip
    )
    out.append(_controls_table(controls, names, runbook))
    out.append(controls_form)
    if plat is not None:
        backlog_rows = [
            [e(b.namespace), e(b.kind), e(f"{b.roots:.0f}"), e(f"{b.behind_seconds:.0f}"),
             link(url("/plans", namespace=b.namespace, kind=b.kind), "plan")]
            for b in plat.backlogs
        ]  # fmt: skip
        out.append(
            table(
                ["namespace", "kind", "backlog roots", "behind (s)", "plan"],
                backlog_rows,
                caption="Backlog per plan (roots settled and not archived)",
                empty="no enabled plan",
            )  # fmt: skip
        )
    out.append("<h2>What needs a person</h2>")
    if plat is not None:
        codes: dict[str, int] = {}
        for (_storage, code), n in plat.failed.items():
            codes[code] = codes.get(code, 0) + n
        out.append(
            table(
                ["error code", "FAILED jobs", "runbook"],
                [[e(c), e(n), runbook_link(runbook, c)] for c, n in sorted(codes.items())],
                caption="FAILED jobs by code",
                empty="no FAILED job",
            )  # fmt: skip
        )
    out.append(
        table(
            ["job", "kind", "code", "attempts", "since"],
            [
                [
                    _job_link(j, names),
                    e(j.kind),
                    runbook_link(runbook, j.error_code) if j.error_code else "-",
                    e(j.attempts),
                    e(_ts(j.updated_at)),
                ]
                for j in failed
            ],
            caption="FAILED jobs (oldest first; retry or abandon)",
            empty="no FAILED job",
        )  # fmt: skip
    )
    out.append(
        table(
            ["job", "kind", "attempts", "lease expired at", "runbook"],
            [
                [
                    _job_link(j, names),
                    e(j.kind),
                    e(j.attempts),
                    e(_ts(j.lease_until)),
                    runbook_link(runbook, "OrbitArchiveLeasesExpired", "stalled"),
                ]
                for j in stalled
            ],
            caption="Stalled jobs (RUNNING with an expired lease)",
            empty="no stalled job",
        )  # fmt: skip
    )
    if plat is not None:
        labels = {bytes.fromhex(s["storage_id"]): s["label"] or s["storage_id"] for s in storages}
        scrub_rows = [
            [
                link(
                    url("/jobs", storage=sid.hex(), state="SUCCEEDED"), labels.get(sid, sid.hex())
                ),
                e(n),
                e(_age(plat.now, plat.scrub_oldest.get(sid))),
                runbook_link(runbook, "OrbitArchiveScrubFailed", "runbook"),
            ]
            for sid, n in sorted(plat.scrub_failed.items())
            if n > 0
        ]
        out.append(
            table(
                ["storage", "jobs that failed their scrub", "oldest verification", "runbook"],
                scrub_rows,
                caption="Scrub failures (archived jobs whose files no longer verify)",
                empty="no scrub failure",
            )  # fmt: skip
        )
    business = snap.business
    if business is None:
        if snap.business_configured:
            out.append(
                message("the business database did not answer: dead letters unknown", ok=False)
            )
    else:
        out.append(
            table(
                ["code", "unresolved REVIEW rows", "runbook"],
                [
                    [link(url("/dead-letters", code=c), c), e(n), runbook_link(runbook, c)]
                    for c, n in sorted(business.review.items())
                    if n
                ],
                caption="Outbox dead letters (REVIEW rows) by code",
                empty="no REVIEW row",
            )  # fmt: skip
        )
    return "".join(out)


def runbook_link(base: str, heading: str, text: str | None = None) -> str:
    return runbook(base, heading, text)


def _ts(value: Any) -> str:
    return format_optional(value) or "-"


def _states(jobs: Mapping[tuple[bytes, str, str], int], storage: bytes) -> dict[str, int]:
    out: dict[str, int] = {}
    for (s, _kind, state), n in jobs.items():
        if s == storage:
            out[str(state)] = out.get(str(state), 0) + n
    return out


def _job_link(job: Any, names: Mapping[bytes, str]) -> str:
    ns = names.get(job.namespace_id, job.namespace_id.hex())
    return link(f"/jobs/{ns}/{job.id.hex()}", job.id.hex())


def _controls_table(controls: Sequence[Any], names: Mapping[bytes, str], base: str) -> str:
    rows = []
    for c in controls:
        parts = []
        if c.scope.storage_id is not None:
            parts.append(f"storage {c.scope.storage_id.hex()}")
        if c.scope.namespace_id is not None:
            parts.append(f"namespace {names.get(c.scope.namespace_id, c.scope.namespace_id.hex())}")
        if c.scope.kind is not None:
            parts.append(f"kind {c.scope.kind}")
        setting = (
            f"{c.max_roots_per_second} roots/s"
            if c.max_roots_per_second
            else " ".join(str(w) for w in c.windows) or "-"
        )
        rows.append(
            [e(c.kind.value), e(", ".join(parts) or "everything"), e(setting), e(c.actor),
             e(_ts(c.since)), e(c.reason or "-"),
             runbook_link(base, "paused" if c.kind.value == "pause" else
                          ("throttled" if c.kind.value == "throttle" else "window"))]
        )  # fmt: skip
    return table(
        ["control", "scope", "setting", "by", "since", "reason", "runbook"], rows,
        caption="Controls in force", empty="no control in force",
    )  # fmt: skip


def markdown_sections(text: str) -> str:
    """docs/operations.md for people: each heading with its GitHub anchor, the text between
    them as preformatted text (no markdown renderer needed)."""
    out: list[str] = []
    chunk: list[str] = []

    def flush() -> None:
        if chunk and "".join(chunk).strip():
            out.append(f"<pre>{e(chr(10).join(chunk).strip())}</pre>")
        chunk.clear()

    for line in text.splitlines():
        m = re.match(r"^(#{1,4}) (.+)$", line)
        if m and not line.startswith("# errant") and not line.startswith("# rows"):
            flush()
            level = min(6, len(m.group(1)) + 1)
            out.append(f'<h{level} id="{e(anchor(m.group(2)))}">{e(m.group(2))}</h{level}>')
        else:
            chunk.append(line)
    flush()
    return "".join(out)


def _age(now: dt.datetime, then: dt.datetime | None) -> str:
    """How long ago ``then`` was, in whole seconds ("-": never)."""
    return "-" if then is None else f"{max(0.0, (now - then).total_seconds()):.0f} s ago"
