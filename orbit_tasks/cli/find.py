"""``orbit archive find NS KIND ID`` and ``orbit archive index NS [JOB]`` (issue 28 item 1):
an archived root by its id, exactly as archived, with the proof that it is the job's; and the id
index that makes a lookup three file reads (docs/archive-format.md "The id index").

Exit codes: 2 bad input (an unknown namespace or kind, a malformed id, a storage no
``--volume`` gives), 4 an id no SUCCEEDED job of the kind holds, 3 jobs not indexed yet (the
id may be in one of them: the line names the command that indexes them), 1 a file or an index
that is not what its proof says (named; no answer is given from it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import click

from orbit_tasks.archive.engine import index as engine_index
from orbit_tasks.archive.engine.storage import Storage, open_storage, parse_volumes
from orbit_tasks.archive.jobs import Job, JobState
from orbit_tasks.archive.store import jobs as job_store
from orbit_tasks.cli.common import emit, json_option
from orbit_tasks.cli.export import emit_roots
from orbit_tasks.cli.places import open_place
from orbit_tasks.cli.restore import TIMESTAMP
from orbit_tasks.db.engine import single_statements
from orbit_tasks.db.registry import platform_engine
from orbit_tasks.errors import ConflictError, InvalidInput, NotFound
from orbit_tasks.ids import from_hex
from orbit_tasks.platform.history import history_kind
from orbit_tasks.platform.store import Namespace, resolve_namespace
from orbit_tasks.timestamps import format_ts

VOLUMES_ENV = "ORBIT_ARCHIVE_VOLUMES"

volume_option = click.option(
    "--volume",
    "volumes",
    multiple=True,
    help="A volume or s3://BUCKET/PREFIX holding the jobs (repeatable; default: the storages of "
    "ORBIT_ARCHIVE_VOLUMES).",
)


def _storages(volumes: Sequence[str]) -> dict[bytes, Storage]:
    """storage id -> storage: each ``--volume`` by its identity, else ORBIT_ARCHIVE_VOLUMES."""
    out: dict[bytes, Storage] = {}
    if volumes:
        # autocommit: no transaction stays open while a storage's identity is read (a session
        # idle inside one is closed by the server after the idle bound, docs/operations.md)
        with platform_engine().connect() as pooled:
            conn = single_statements(pooled)
            for given in volumes:
                opened = open_place(conn, given)
                out.setdefault(opened.identity.storage_id, opened.storage)
        return out
    for hex_id, place in parse_volumes(os.environ.get(VOLUMES_ENV)).items():
        out[bytes.fromhex(hex_id)] = open_storage(place, retry_seconds=10.0)
    return out


def _namespace(ns: str) -> Namespace:
    """NS, an unknown one being bad input here (exit 2): exit 4 means "never archived"."""
    with platform_engine().connect() as conn:
        try:
            return resolve_namespace(conn, ns)
        except NotFound as exc:
            raise InvalidInput(str(exc)) from None


def _need_storages(jobs: Sequence[Job], mounted: dict[bytes, Storage]) -> None:
    missing = sorted({j.storage_id.hex() for j in jobs if j.storage_id not in mounted})
    if missing:
        raise InvalidInput(
            f"jobs to search are on storage {', '.join(missing)}, which no --volume gives; add a "
            "--volume for each"
        )


def _found_doc(f: engine_index.Found, reads: engine_index.Reads, ns: Namespace) -> dict[str, Any]:
    job, top = f.job, f.top
    line = f.line.decode("utf-8")
    prev = top.file_name(f.seq - 1)
    nxt = top.file_name(f.seq + 1) if f.seq < top.batches else None
    return {
        "found": True,
        "namespace": ns.name,
        "namespace_id": job.namespace_id.hex(),
        "kind": job.kind,
        "id": json.loads(line)["root"]["id"],
        "job": {
            "id": job.id.hex(), "state": job.state.value, "storage_id": job.storage_id.hex(),
            "batches": job.batches, "roots": job.roots, "last_sha256": job.last_sha256,
            "created_at": format_ts(job.created_at),
        },
        "file": {"name": f.file_name, "seq": f.seq, "line": f.line_no, "where": f.where,
                 "roots": f.header["roots"], "first": f.header["first"],
                 "last": f.header["last"]},
        "line": line,
        "root": json.loads(line),
        "proof": {
            "index": top.name, "index_sha256": f.index.index_sha256,
            "index_built_at": format_ts(f.index.built_at),
            "file_sha256": top.link(f.seq),
            "prev_sha256": f.header["prev_sha256"], "prev_file": prev, "next_file": nxt,
            "last_sha256": job.last_sha256, "batches": job.batches,
            "checked": [
                "index hashes to the sha256 recorded for the job (orbit_archive_job_indexes)",
                "index lists the chain from the manifest to the job row's last_sha256 "
                f"({job.batches} batches, {job.roots} roots)",
                "file hashes to the sha256 in its name",
                "file's prev_sha256 is the previous file's name in the chain",
                "the whole chain verified when the index was built",
            ],
        },
        "files_read": len(reads.names),
        "files_read_names": list(reads.names),
    }  # fmt: skip


def _found_text(doc: dict[str, Any]) -> str:
    job, file, proof = doc["job"], doc["file"], doc["proof"]
    rows = [
        ("job", f"{job['id']} ({job['state']}, {doc['kind']}, storage {job['storage_id']})"),
        ("file", f"{file['name']} (batch {file['seq']} of {job['batches']}, line {file['line']})"),
        ("where", file["where"]),
        ("root", doc["line"]),
        ("proof", f"index {proof['index']} = the sha256 recorded for the job "
                  f"(built {proof['index_built_at']})"),
        ("", f"file sha256 {proof['file_sha256']} = its name"),
        ("", f"prev_sha256 {proof['prev_sha256']} = {proof['prev_file']}"),
        ("", f"chain ends at last_sha256 {proof['last_sha256']} = the job row "
             f"({job['batches']} batches)"),
        ("files read", str(doc["files_read"])),
    ]  # fmt: skip
    return "\n".join(f"{k:<12}{v}".rstrip() if k else f"{'':<12}{v}" for k, v in rows)


@click.command("find")
@click.argument("ns")
@click.argument("kind")
@click.argument("root_id", metavar="[ID]", required=False)
@volume_option
@click.option(
    "--settled-from", "settled_from", type=TIMESTAMP, default=None,
    help="Without ID: list the roots settled at or after this time (UTC).",
)  # fmt: skip
@click.option(
    "--settled-until", "settled_until", type=TIMESTAMP, default=None,
    help="Without ID: list the roots settled before this time (UTC).",
)  # fmt: skip
@json_option
def archive_find(
    ns: str,
    kind: str,
    root_id: str | None,
    volumes: tuple[str, ...],
    settled_from: datetime | None,
    settled_until: datetime | None,
    as_json: bool,
) -> None:
    """An archived root by its id: the job, the file, its line exactly as archived and the proof
    (exit 4: never archived; 3: jobs not indexed yet; 1: a damaged file, named). Without ID,
    with --settled-from/--settled-until: the roots archived in that window across jobs, as
    `orbit archive roots` lists them (each file verified as it is read)."""
    history_kind(kind)
    window = settled_from is not None or settled_until is not None
    if root_id is not None and window:
        raise InvalidInput(
            "give either an ID or --settled-from/--settled-until (a window), not both"
        )
    if window:
        if not volumes:
            raise InvalidInput("a window listing needs --volume (each storage of its jobs)")
        emit_roots(ns, kind, volumes, settled_from, settled_until, as_json)
        return
    if root_id is None:
        raise InvalidInput(
            "give the ID of the root to find (32 hexadecimal characters), or a window with "
            "--settled-from/--settled-until"
        )
    rid = from_hex(root_id, "root id")
    namespace = _namespace(ns)
    engine = platform_engine()
    jobs = engine_index.indexed_jobs(engine, namespace.id, kind)
    mounted = _storages(volumes)
    _need_storages([j for j, x in jobs if x is not None], mounted)
    search = engine_index.find_root(jobs, lambda j: mounted[j.storage_id], rid)
    if search.found is not None:
        doc = _found_doc(search.found, search.reads, namespace)
        emit(doc, as_json, _found_text)
        return
    if search.unindexed:
        raise ConflictError(
            f"root {rid.hex()} is in none of the {search.jobs_searched} indexed {kind} jobs of "
            f"namespace {namespace.name}, but {len(search.unindexed)} SUCCEEDED job(s) have no "
            f"index yet; run `orbit archive index {namespace.name}` and ask again"
        )
    raise NotFound(
        f"root {rid.hex()} is not archived: none of the {search.jobs_searched} SUCCEEDED {kind} "
        f"jobs of namespace {namespace.name} holds it ({len(search.reads.names)} files read)"
    )


@click.command("index")
@click.argument("ns")
@click.argument("job", required=False)
@volume_option
@json_option
def archive_index(ns: str, job: str | None, volumes: tuple[str, ...], as_json: bool) -> None:
    """Build now the id index of a SUCCEEDED job, or of every SUCCEEDED job of NS without one
    (each chain is verified while it is read; exit 1 names a bad file)."""
    job_id = None if job is None else from_hex(job, "job id")
    namespace = _namespace(ns)
    engine = platform_engine()
    if job_id is not None:
        with engine.connect() as conn:
            one = job_store.require_job(conn, namespace.id, job_id)
        if one.state is not JobState.SUCCEEDED:
            raise ConflictError(
                f"job {one.id.hex()} is {one.state.value}; only SUCCEEDED jobs are indexed"
            )
        todo = [one]
    else:
        todo, after = [], None
        with engine.connect() as conn:
            while True:
                page, after = job_store.list_jobs(
                    conn, namespace.id, state=JobState.SUCCEEDED, limit=1000, after=after
                )
                todo += page
                if after is None:
                    break
    mounted = _storages(volumes)
    _need_storages(todo, mounted)
    results = []
    for j in todo:
        built = engine_index.build_index(engine, mounted[j.storage_id], j)
        results.append({
            "job_id": j.id.hex(), "kind": j.kind, "index_sha256": built.row.index_sha256,
            "roots": built.row.roots, "shards": built.row.shards, "built": built.written,
        })  # fmt: skip
    lines = [
        f"{'indexed' if r['built'] else 'already indexed'}: job {r['job_id']} ({r['kind']}, "
        f"{r['roots']} roots, {r['shards']} shards) index-{r['index_sha256']}.json"
        for r in results
    ] or [f"no SUCCEEDED job in namespace {namespace.name}"]
    emit({"jobs": results}, as_json, "\n".join(lines))
