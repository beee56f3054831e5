"""The reference platform API as a real ``orbit api serve`` subprocess on a real MariaDB."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, Table, func, select, text

from orbit_tasks.db.engine import db_now
from orbit_tasks.db.history_tables import audit_events, idempotency_records, tasks
from orbit_tasks.platform import store as ps
from tests.support.api_server import ApiServer, running_api_server
from tests.support.db import mariadb_database, migrated_engine

pytestmark = pytest.mark.mariadb

MiB = 1024 * 1024


@dataclass
class Platform:
    engine: Engine
    server: ApiServer
    client: httpx.Client
    ns: bytes
    other_ns: bytes
    emails: bytes
    reports: bytes
    other_queue: bytes
    tok_all: str
    tok_list: str
    tok_revoked: str
    tok_other: str
    cred_all: bytes
    cred_list: bytes

    def url(self, ns: bytes | str, queue: bytes | str) -> str:
        ns_s = ns.hex() if isinstance(ns, bytes) else ns
        q_s = queue.hex() if isinstance(queue, bytes) else queue
        return f"/v1/namespaces/{ns_s}/queues/{q_s}/tasks"

    def post(
        self,
        body: bytes,
        key: str | None,
        *,
        token: str | None = None,
        ns: bytes | str | None = None,
        queue: bytes | str | None = None,
    ) -> httpx.Response:
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Idempotency-Key"] = key
        headers["Authorization"] = f"Bearer {token or self.tok_all}"
        return self.client.post(
            self.url(ns or self.ns, queue or self.emails), content=body, headers=headers
        )

    def count(self, table: Table, **where: object) -> int:
        stmt = select(func.count()).select_from(table)
        for col, value in where.items():
            stmt = stmt.where(table.c[col] == value)
        with self.engine.connect() as conn:
            return int(conn.execute(stmt).scalar_one())


@pytest.fixture(scope="module")
def platform() -> Iterator[Platform]:
    with mariadb_database("orbit_api") as url, migrated_engine(url, "platform") as engine:
        with engine.begin() as conn:
            ns = ps.create_namespace(conn, "acme")
            other_ns = ps.create_namespace(conn, "globex")
            emails = ps.create_queue(conn, ns, "emails")
            reports = ps.create_queue(conn, ns, "reports")
            other_queue = ps.create_queue(conn, other_ns, "emails")
            cred_all, tok_all = ps.create_credential(conn, ns, None, "all")
            cred_list, tok_list = ps.create_credential(conn, ns, ["emails"], "list")
            cred_rev, tok_revoked = ps.create_credential(conn, ns, None, "revoked")
            _, tok_other = ps.create_credential(conn, other_ns, None, "other")
            ps.revoke_credential(conn, cred_rev, db_now(conn))
        with (
            running_api_server(url) as server,
            httpx.Client(base_url=server.base_url, timeout=30.0) as client,
        ):
            yield Platform(
                engine,
                server,
                client,
                ns,
                other_ns,
                emails,
                reports,
                other_queue,
                tok_all,
                tok_list,
                tok_revoked,
                tok_other,
                cred_all,
                cred_list,
            )


def error_code(resp: httpx.Response) -> str:
    doc = resp.json()
    assert set(doc) == {"error", "message"}
    return str(doc["error"])


# --- identity -------------------------------------------------------------------------------------


def test_identity_of_an_all_queues_credential(platform: Platform) -> None:
    resp = platform.client.get(
        "/v1/credential", headers={"Authorization": f"Bearer {platform.tok_all}"}
    )
    assert resp.status_code == 200
    assert resp.json() == {
        "credential_id": platform.cred_all.hex(),
        "namespace_id": platform.ns.hex(),
        "namespace": "acme",
        "all_queues": True,
        "queues": [
            {"id": platform.emails.hex(), "name": "emails"},
            {"id": platform.reports.hex(), "name": "reports"},
        ],
    }


def test_identity_of_an_allow_list_credential(platform: Platform) -> None:
    resp = platform.client.get(
        "/v1/credential", headers={"Authorization": f"Bearer {platform.tok_list}"}
    )
    assert resp.status_code == 200
    doc = resp.json()
    assert doc["credential_id"] == platform.cred_list.hex()
    assert doc["all_queues"] is False
    assert doc["queues"] == [{"id": platform.emails.hex(), "name": "emails"}]


@pytest.mark.parametrize("auth", [None, "Bearer nope", "Basic abc", "Bearer", "REVOKED"])
def test_identity_refuses_bad_tokens(platform: Platform, auth: str | None) -> None:
    if auth == "REVOKED":
        auth = f"Bearer {platform.tok_revoked}"
    headers = {} if auth is None else {"Authorization": auth}
    resp = platform.client.get("/v1/credential", headers=headers)
    assert resp.status_code == 401
    assert error_code(resp) == "unauthenticated"
    assert resp.headers["www-authenticate"] == "Bearer"


def test_healthz_and_openapi(platform: Platform) -> None:
    assert platform.client.get("/healthz").json() == {"ok": True}
    doc = platform.client.get("/openapi.json").json()
    submit = doc["paths"]["/v1/namespaces/{ns}/queues/{queue}/tasks"]["post"]
    assert {"200", "201", "400", "401", "403", "404", "409", "413"} <= set(submit["responses"])
    assert "idempotency_conflict" in submit["responses"]["409"]["description"]
    assert "requestBody" in submit
    key_param = [p for p in submit["parameters"] if p["name"] == "Idempotency-Key"]
    assert key_param and key_param[0]["required"] is True and key_param[0]["in"] == "header"
    assert "422" not in submit["responses"]  # never answered: headers and body are read by hand
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert "/v1/credential" in doc["paths"]


# --- accept, replay, conflict ---------------------------------------------------------------------


def test_accept_then_replay_returns_identical_receipt_bytes(platform: Platform) -> None:
    body = b'{"to": "a@example.com", "amount": 10.50}'
    first = platform.post(body, "accept-1")
    assert first.status_code == 201, first.text
    assert "idempotent-replayed" not in first.headers
    receipt = first.json()
    assert list(receipt) == sorted(receipt)
    assert first.content == json.dumps(receipt, separators=(",", ":")).encode()
    assert receipt["idempotency_key"] == "accept-1"
    assert receipt["namespace_id"] == platform.ns.hex()
    assert receipt["queue_id"] == platform.emails.hex()

    again = platform.post(body, "accept-1")
    assert again.status_code == 200
    assert again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content
    # names in the path address the same namespace and queue: still a replay
    by_name = platform.post(body, "accept-1", ns="acme", queue="emails")
    assert by_name.status_code == 200
    assert by_name.content == first.content

    task_id = bytes.fromhex(receipt["task_id"])
    with platform.engine.connect() as conn:
        task = conn.execute(select(tasks).where(tasks.c.id == task_id)).one()
        record = conn.execute(
            select(idempotency_records).where(idempotency_records.c.task_id == task_id)
        ).one()
        audit = conn.execute(
            select(audit_events).where(audit_events.c.target_id == receipt["task_id"])
        ).all()
    accepted = datetime.strptime(receipt["accepted_at"], "%Y-%m-%dT%H:%M:%S.%fZ")
    assert (task.namespace_id, task.queue_id, task.state) == (
        platform.ns,
        platform.emails,
        "QUEUED",
    )
    assert task.idempotency_key == "accept-1"
    assert task.created_at == accepted
    assert record.namespace_id == platform.ns
    assert record.request_sha256 == hashlib.sha256(body).hexdigest()
    assert record.receipt_json.encode() == first.content
    assert record.created_at == accepted
    assert record.expires_at == accepted + timedelta(hours=72)
    assert len(audit) == 1
    assert audit[0].action == "api.task.accepted"
    assert audit[0].actor == f"credential:{platform.cred_all.hex()}"
    assert audit[0].created_at == accepted
    detail = json.loads(audit[0].detail_json)
    assert detail["queue_id"] == platform.emails.hex()
    assert "accept-1" not in audit[0].detail_json
    assert platform.count(tasks, idempotency_key="accept-1") == 1


def test_same_key_with_another_body_or_queue_is_a_conflict(platform: Platform) -> None:
    assert platform.post(b'{"n": 1}', "conflict-1").status_code == 201
    other_body = platform.post(b'{"n": 2}', "conflict-1")
    assert other_body.status_code == 409
    assert error_code(other_body) == "idempotency_conflict"
    # byte-different but JSON-equal is another body too: bodies are compared as bytes
    assert platform.post(b'{"n":1}', "conflict-1").status_code == 409
    other_queue = platform.post(b'{"n": 1}', "conflict-1", queue=platform.reports)
    assert other_queue.status_code == 409
    assert platform.count(tasks, idempotency_key="conflict-1") == 1


# --- refusals (nothing written) -------------------------------------------------------------------


def test_queue_and_namespace_refusals(platform: Platform) -> None:
    body = b'{"x": 1}'
    before = platform.count(tasks)
    cases = [
        (dict(queue="0" * 32), 404, "queue_not_found"),
        (dict(queue="nosuchqueue"), 404, "queue_not_found"),
        (dict(ns=platform.other_ns, queue=platform.other_queue), 403, "forbidden"),
        (dict(ns="globex", queue="emails"), 403, "forbidden"),
        (dict(ns="f" * 32), 403, "forbidden"),
        (dict(token=platform.tok_list, queue=platform.reports), 403, "forbidden"),
        (dict(token=platform.tok_other), 403, "forbidden"),
        (dict(token="orb_unknown"), 401, "unauthenticated"),
        (dict(token=platform.tok_revoked), 401, "unauthenticated"),
    ]
    for i, (kwargs, status, code) in enumerate(cases):
        resp = platform.post(body, f"refused-{i}", **kwargs)  # type: ignore[arg-type]
        assert (resp.status_code, error_code(resp)) == (status, code), kwargs
    # the allow-listed queue itself works for the allow-list credential
    ok = platform.post(body, "allowed-1", token=platform.tok_list, queue="emails")
    assert ok.status_code == 201
    assert platform.count(tasks) == before + 1


def test_disabled_namespace_is_403(platform: Platform) -> None:
    body = b'{"d": 1}'
    kwargs = dict(token=platform.tok_other, ns="globex", queue="emails")
    assert platform.post(body, "disabled-1", **kwargs).status_code == 201
    with platform.engine.begin() as conn:
        ps.set_namespace_state(conn, platform.other_ns, "DISABLED")
    try:
        resp = platform.post(body, "disabled-2", **kwargs)
        assert (resp.status_code, error_code(resp)) == (403, "forbidden")
        assert platform.count(tasks, idempotency_key="disabled-2") == 0
    finally:
        with platform.engine.begin() as conn:
            ps.set_namespace_state(conn, platform.other_ns, "ACTIVE")


def test_bad_requests_are_400_and_write_nothing(platform: Platform) -> None:
    before = (platform.count(tasks), platform.count(idempotency_records))
    cases: list[tuple[bytes, str | None, str]] = [
        (b"{not json", "bad-1", "bad_json"),
        (b"[1, 2, 3]", "bad-2", "bad_json"),
        (b'"a string"', "bad-3", "bad_json"),
        (b"", "bad-4", "bad_json"),
        (b'{"a": NaN}', "bad-5", "bad_json"),
        (b'{"a": 1, "a": 2}', "bad-6", "bad_json"),
        (b'{"a": "\xff\xfe"}', "bad-7", "bad_json"),
        (b'{"a": 1}', None, "bad_idempotency_key"),
        (b'{"a": 1}', "k" * 129, "bad_idempotency_key"),
        (b'{"a": 1}', "tab\tkey", "bad_idempotency_key"),
    ]
    for body, key, code in cases:
        resp = platform.post(body, key)
        assert (resp.status_code, error_code(resp)) == (400, code), (body, key)
    # a non-ASCII header value (latin-1 bytes on the wire)
    resp = platform.client.post(
        platform.url(platform.ns, platform.emails),
        content=b'{"a": 1}',
        headers=[
            (b"Authorization", f"Bearer {platform.tok_all}".encode()),
            (b"Idempotency-Key", b"caf\xe9"),
            (b"Content-Type", b"application/json"),
        ],
    )
    assert (resp.status_code, error_code(resp)) == (400, "bad_idempotency_key")
    assert (platform.count(tasks), platform.count(idempotency_records)) == before


def test_body_over_one_mebibyte_is_413(platform: Platform) -> None:
    before = platform.count(tasks)
    over = b'{"p":"' + b"x" * (MiB - 8 + 1) + b'"}'
    assert len(over) == MiB + 1
    resp = platform.post(over, "big-1")
    assert (resp.status_code, error_code(resp)) == (413, "too_large")

    def chunks() -> Iterator[bytes]:  # no Content-Length: refused while streaming
        yield b'{"p":"'
        for _ in range(17):
            yield b"y" * 65536
        yield b'"}'

    streamed = platform.client.post(
        platform.url(platform.ns, platform.emails),
        content=chunks(),
        headers={
            "Authorization": f"Bearer {platform.tok_all}",
            "Idempotency-Key": "big-2",
            "Content-Type": "application/json",
        },
    )
    assert (streamed.status_code, error_code(streamed)) == (413, "too_large")
    assert platform.count(tasks) == before

    exactly = b'{"p":"' + b"z" * (MiB - 8) + b'"}'
    assert len(exactly) == MiB
    ok = platform.post(exactly, "big-3")
    assert ok.status_code == 201
    with platform.engine.connect() as conn:
        stored = conn.execute(
            select(tasks.c.request_json).where(tasks.c.idempotency_key == "big-3")
        ).scalar_one()
    assert stored.encode("utf-8") == exactly


def test_client_disconnect_mid_body_writes_nothing(platform: Platform) -> None:
    before = platform.count(tasks)
    request = (
        f"POST {platform.url(platform.ns, platform.emails)} HTTP/1.1\r\n"
        f"Host: 127.0.0.1\r\nAuthorization: Bearer {platform.tok_all}\r\n"
        "Idempotency-Key: cut-1\r\nContent-Type: application/json\r\n"
        "Content-Length: 1000\r\n\r\n"
    ).encode() + b'{"partial": '
    with socket.create_connection(("127.0.0.1", platform.server.port), timeout=10) as sock:
        sock.sendall(request)
    deadline = time.monotonic() + 10
    while "api.request.disconnected" not in platform.server.output():
        assert time.monotonic() < deadline, "the server did not notice the disconnect"
        time.sleep(0.05)
    assert platform.count(tasks) == before
    assert platform.post(b'{"after": 1}', "cut-2").status_code == 201  # still serving


def test_body_is_stored_byte_exact(platform: Platform) -> None:
    body = (
        ' \t{ "amount" :12345678901234567890.123456789,\r\n  "huge":1e400, "neg": -0.000,'
        '"emoji":"😀𝄞", "escaped":"\\ud83d\\ude00\\u00e9", "nested" : {"a":[1.10 , 2E+5]} }\n\n'
    ).encode()
    resp = platform.post(body, "exact-1")
    assert resp.status_code == 201, resp.text
    task_id = bytes.fromhex(resp.json()["task_id"])
    with platform.engine.connect() as conn:
        stored = conn.execute(
            select(tasks.c.request_json).where(tasks.c.id == task_id)
        ).scalar_one()
        raw_bytes = conn.execute(
            text("SELECT CAST(request_json AS BINARY) FROM orbit_tasks WHERE id = :id"),
            {"id": task_id},
        ).scalar_one()
    assert stored.encode("utf-8") == body
    assert bytes(raw_bytes) == body
    replay = platform.post(body, "exact-1")
    assert replay.status_code == 200


def test_concurrent_requests_with_one_key_make_one_task(platform: Platform) -> None:
    body = b'{"concurrent": true, "v": 3.14159265358979323846264338327950288}'
    n = 32
    barrier = threading.Barrier(n)
    results: list[httpx.Response | BaseException] = [None] * n  # type: ignore[list-item]

    def send(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = platform.post(body, "race-1")
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            results[i] = exc

    threads = [threading.Thread(target=send, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    responses = [r for r in results if isinstance(r, httpx.Response)]
    assert len(responses) == n, [r for r in results if not isinstance(r, httpx.Response)]
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200] * (n - 1) + [201], statuses
    assert len({r.content for r in responses}) == 1
    assert all(
        r.headers.get("idempotent-replayed") == "true" for r in responses if r.status_code == 200
    )
    assert platform.count(tasks, idempotency_key="race-1") == 1
    assert platform.count(idempotency_records, idempotency_key="race-1") == 1
    task_hex = responses[0].json()["task_id"]
    assert platform.count(audit_events, target_id=task_hex) == 1


def test_tokens_and_keys_never_reach_the_database_or_the_log(platform: Platform) -> None:
    marker_key = "marker-key-5d1c0e7f"
    assert platform.post(b'{"m": 1}', marker_key).status_code == 201
    assert platform.post(b'{"m": 1}', marker_key).status_code == 200
    assert platform.post(b'{"m": 2}', marker_key).status_code == 409
    assert platform.post(b'{"m": 1}', marker_key, token=platform.tok_revoked).status_code == 401
    assert platform.post(b'{"m": 1}', marker_key, token=platform.tok_other).status_code == 403
    assert platform.post(b"[]", marker_key).status_code == 400
    tokens = [platform.tok_all, platform.tok_list, platform.tok_revoked, platform.tok_other]

    output = platform.server.output()
    assert "api.task.accepted" in output  # the log is really captured
    for secret in [*tokens, marker_key, '{"m": 1}', '{"m":']:
        assert secret not in output

    with platform.engine.connect() as conn:
        names = [r[0] for r in conn.execute(text("SHOW TABLES"))]
        dump = []
        for name in names:
            for row in conn.execute(text(f"SELECT * FROM `{name}`")):
                dump.append(repr(tuple(row)))
    everything = "\n".join(dump)
    assert marker_key in everything  # the dump really covers the tasks
    for token in tokens:
        assert token not in everything
        assert hashlib.sha256(token.encode()).hexdigest() in everything


# --- other databases and failures -----------------------------------------------------------------


def test_embedded_sqlite_platform(tmp_path: Path) -> None:
    """The demo's embedded default: same API on a SQLite platform file, racing included."""
    url = f"sqlite:///{tmp_path / 'platform.sqlite3'}"
    with migrated_engine(url, "platform") as engine:
        with engine.begin() as conn:
            ns = ps.create_namespace(conn, "acme")
            ps.create_queue(conn, ns, "emails")
            _, token = ps.create_credential(conn, ns, None)
        body = '{"a": 1e400, "b": "😀"}'.encode()
        with running_api_server(url) as server:
            headers = {
                "Authorization": f"Bearer {token}",
                "Idempotency-Key": "k-sqlite",
                "Content-Type": "application/json",
            }
            target = f"{server.base_url}/v1/namespaces/acme/queues/emails/tasks"
            results: list[httpx.Response] = []
            lock = threading.Lock()

            def send() -> None:
                resp = httpx.post(target, headers=headers, content=body, timeout=60)
                with lock:
                    results.append(resp)

            threads = [threading.Thread(target=send) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=120)
        assert sorted(r.status_code for r in results) == [200] * 7 + [201]
        assert len({r.content for r in results}) == 1
        with engine.connect() as conn:
            stored = conn.execute(select(tasks.c.request_json)).scalars().all()
            record = conn.execute(select(idempotency_records)).one()
        assert [s.encode() for s in stored] == [body]
        assert record.expires_at - record.created_at == timedelta(hours=72)


def test_unreachable_database_is_503_and_broken_schema_is_500_without_leaks(
    mariadb_url: str,
) -> None:
    token = "orb_leakcheck_token_value"
    key = "leakcheck-key"
    post_headers = {
        "Authorization": f"Bearer {token}",
        "Idempotency-Key": key,
        "Content-Type": "application/json",
    }
    body = b'{"leak": "check"}'
    # a port nobody listens on: every database call fails with OperationalError
    with running_api_server("mysql+mysqldb://root@127.0.0.1:1/none") as down:
        with httpx.Client(base_url=down.base_url, timeout=60) as client:
            assert client.get("/healthz").status_code == 200
            resp = client.post(
                "/v1/namespaces/acme/queues/q/tasks", headers=post_headers, content=body
            )
            assert (resp.status_code, error_code(resp)) == (503, "unavailable")
            assert int(resp.headers["retry-after"]) >= 1
            resp = client.get("/v1/credential", headers={"Authorization": f"Bearer {token}"})
            assert (resp.status_code, error_code(resp)) == (503, "unavailable")
            assert int(resp.headers["retry-after"]) >= 1
            ready = client.get("/readyz")
            assert (ready.status_code, error_code(ready)) == (503, "unavailable")
        down_log = down.output()
    # a table dropped after the start check (an empty database is refused at start): the SQL
    # itself fails
    with (
        migrated_engine(mariadb_url, "platform") as engine,
        running_api_server(mariadb_url) as broken,
    ):
        with engine.begin() as conn:
            conn.exec_driver_sql("DROP TABLE orbit_credentials")
        with httpx.Client(base_url=broken.base_url, timeout=60) as client:
            resp = client.post(
                "/v1/namespaces/acme/queues/q/tasks", headers=post_headers, content=body
            )
            assert (resp.status_code, error_code(resp)) == (500, "internal")
        broken_log = broken.output()
    assert "api.db.unavailable" in down_log
    assert "db.schema.unchecked" in down_log  # started although its schema could not be checked
    assert "api.request.failed" in broken_log
    for log_text in (down_log, broken_log):
        assert "Traceback" not in log_text
        assert token not in log_text
        assert key not in log_text
        assert "leak" not in log_text


# --- every error in the documented shape (issue 7 item 8) -----------------------------------------


def test_unknown_path_and_wrong_method_answer_the_error_shape(platform: Platform) -> None:
    missing = platform.client.get("/v1/nothing-here")
    assert (missing.status_code, error_code(missing)) == (404, "not_found")
    assert missing.headers["content-type"] == "application/json"
    wrong = platform.client.post("/v1/credential", content=b"{}")
    assert (wrong.status_code, error_code(wrong)) == (405, "method_not_allowed")
    assert wrong.headers["allow"] == "GET"
    listed = platform.client.get(platform.url(platform.ns, platform.emails))
    assert (listed.status_code, error_code(listed)) == (405, "method_not_allowed")
    assert listed.headers["allow"] == "POST"


def test_openapi_documents_every_error_answer(platform: Platform) -> None:
    doc = platform.client.get("/openapi.json").json()
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            assert "405" in operation["responses"], (path, method)
    submit = doc["paths"]["/v1/namespaces/{ns}/queues/{queue}/tasks"]["post"]
    assert "unsupported_media_type" in submit["responses"]["415"]["description"]
    assert "Retry-After" in submit["responses"]["503"]["headers"]
    ready = doc["paths"]["/readyz"]["get"]
    assert {"200", "503"} <= set(ready["responses"])


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", None, "application/json; charset=latin-1"],
)
def test_a_body_that_is_not_declared_json_is_415(
    platform: Platform, content_type: str | None
) -> None:
    before = platform.count(tasks)
    headers = {"Authorization": f"Bearer {platform.tok_all}", "Idempotency-Key": "ct-1"}
    if content_type is not None:
        headers["Content-Type"] = content_type
    resp = platform.client.post(
        platform.url(platform.ns, platform.emails), content=b'{"a": 1}', headers=headers
    )
    assert (resp.status_code, error_code(resp)) == (415, "unsupported_media_type")
    assert "application/json" in resp.json()["message"]
    assert platform.count(tasks) == before


@pytest.mark.parametrize(
    "content_type",
    ["application/json", "Application/JSON; charset=UTF-8", 'application/json;charset="utf-8"'],
)
def test_json_content_types_are_accepted(platform: Platform, content_type: str) -> None:
    resp = platform.client.post(
        platform.url(platform.ns, platform.emails),
        content=b'{"ct": 1}',
        headers={
            "Authorization": f"Bearer {platform.tok_all}",
            "Idempotency-Key": f"ct-ok-{content_type}",
            "Content-Type": content_type,
        },
    )
    assert resp.status_code in (200, 201), resp.text


def _nested(depth: int) -> bytes:
    return b'{"a":' + b"[" * (depth - 1) + b"1" + b"]" * (depth - 1) + b"}"


def test_bodies_enqueue_refuses_are_refused_by_the_api_too(platform: Platform) -> None:
    """One rule on both sides (orbit_tasks/json_document.py): lone surrogate escapes and
    nesting past what JSON_VALID stores are 400 here as they are InvalidRequest in enqueue()."""
    before = platform.count(tasks)
    for i, body in enumerate([b'{"a": "\\ud800"}', b'{"\\udc00": 1}', _nested(32), _nested(999)]):
        resp = platform.post(body, f"rule-{i}")
        assert (resp.status_code, error_code(resp)) == (400, "bad_json"), body[:20]
    assert platform.count(tasks) == before
    assert platform.post(_nested(31), "rule-ok").status_code == 201


def test_readiness_follows_the_database_liveness_does_not(tmp_path: Path) -> None:
    """/healthz (liveness) answers while the database is gone; /readyz (readiness) is 503 with
    Retry-After until the database is back. The database really goes away: the API reaches
    MariaDB through a TCP hop that the test cuts (connections reset, new ones refused)."""
    from urllib.parse import urlsplit

    from tests.support.api_server import tcp_forwarder
    from tests.support.db import MARIADB_SERVER_URL

    server = urlsplit(MARIADB_SERVER_URL.replace("mysql+mysqldb", "mysql"))
    with (
        mariadb_database("orbit_ready") as url,
        migrated_engine(url, "platform"),
        tcp_forwarder(server.hostname or "127.0.0.1", server.port or 3306) as hop,
    ):
        db_name = url.rsplit("/", 1)[1]
        via_hop = f"mysql+mysqldb://root@127.0.0.1:{hop.port}/{db_name}"
        with (
            running_api_server(via_hop) as api,
            httpx.Client(base_url=api.base_url, timeout=30) as client,
        ):
            assert client.get("/readyz").status_code == 200
            hop.down()
            assert client.get("/healthz").status_code == 200
            ready = client.get("/readyz")
            assert (ready.status_code, error_code(ready)) == (503, "unavailable")
            assert int(ready.headers["retry-after"]) >= 1
            resp = client.get("/v1/credential", headers={"Authorization": "Bearer orb_x"})
            assert (resp.status_code, error_code(resp)) == (503, "unavailable")
            assert int(resp.headers["retry-after"]) >= 1
            hop.up()
            end = time.monotonic() + 20
            while client.get("/readyz").status_code != 200:
                assert time.monotonic() < end, "not ready again after the database came back"
                time.sleep(0.2)
