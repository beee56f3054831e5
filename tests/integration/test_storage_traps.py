"""The storage traps of an operator's first hour (issue 27): ``orbit storage init`` and
``--volume`` through the real ``orbit`` script, on real folders, a real MariaDB and S3 on a real
HTTP server (moto's, tests/support/s3.py).

- a missing folder is refused unless ``--create`` says so (a typo or an unmounted volume must not
  become a storage on the root disk);
- storages cannot nest either way: not inside another, and not around others (folders and S3);
- every hint names the safe next step, never "run ``orbit storage init``" for a typo'd prefix or
  another deployment's storage;
- ``storage init`` again with other options is refused, naming them and their registered values;
- one bucket and prefix is registered once; an older pair registered under two endpoints is
  reachable by the storages' ids;
- a prefix with ``.``/``..``/empty segments or a leading ``/``, and an endpoint with a bad port,
  scheme or host, are one line, exit 2, nothing written.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from orbit_tasks.archive.engine.volume import IDENTITY_FILE, read_identity, write_identity
from orbit_tasks.ids import new_id
from orbit_tasks.platform import store
from tests.support.cli import assert_one_line_error, orbit_env, run_orbit
from tests.support.db import mariadb_database, migrated_engine
from tests.support.s3 import REGION, MotoServer, bucket_name
from tests.support.s3 import moto_fixture as moto_fixture  # the session's S3 server

pytestmark = [pytest.mark.mariadb]


@pytest.fixture
def env(mariadb_url: str, platform_engine: Engine, moto: MotoServer) -> dict[str, str]:
    return orbit_env(mariadb_url, **moto.env())


def _counts(engine: Engine) -> tuple[int, int]:
    with engine.connect() as conn:
        storages = conn.execute(text("SELECT COUNT(*) FROM orbit_archive_storages")).scalar()
        located = conn.execute(text("SELECT COUNT(*) FROM orbit_archive_object_storages")).scalar()
    return int(storages or 0), int(located or 0)


def _tree(root: Path) -> list[str]:
    """Every path under ``root`` (relative), to show that nothing was written."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _ok(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    return json.loads(proc.stdout)


def _init(env: dict[str, str], path: Path | str, *extra: str) -> Any:
    return _ok(run_orbit(["storage", "init", str(path), *extra, "--json"], env))


def _s3(moto: MotoServer, url: str, *extra: str, endpoint: str | None = None) -> list[str]:
    return [*moto.init_args(url, endpoint), *extra]


# --------------------------------------------------------------------------- item 1: --create


def test_a_missing_folder_is_refused_unless_create_says_so(
    env: dict[str, str], platform_engine: Engine, tmp_path: Path
) -> None:
    missing = tmp_path / "mnt" / "archive1"
    for extra in ([], ["--label", "a1"]):
        proc = run_orbit(["storage", "init", str(missing), *extra], env)
        line = assert_one_line_error(proc, 2, str(missing), "does not exist", "--create")
        assert "storage init" not in line.replace("--create", ""), line
    assert not (tmp_path / "mnt").exists()
    assert _counts(platform_engine) == (0, 0)

    # an existing empty folder (the mounted volume) needs no --create
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    assert _init(env, mounted)["status"] == "created"

    # --create makes the folder (and its parents), as before
    created = _init(env, missing, "--create", "--label", "a1")
    assert created["status"] == "created"
    assert read_identity(missing).storage_id.hex() == created["id"]
    # --create on a registered volume is idempotent too
    assert _init(env, missing, "--create")["id"] == created["id"]
    assert _counts(platform_engine) == (2, 0)


def test_create_is_refused_with_an_s3_url(
    env: dict[str, str], platform_engine: Engine, moto: MotoServer
) -> None:
    bucket = moto.bucket(bucket_name("create"))
    proc = run_orbit(_s3(moto, f"s3://{bucket}/p", "--create"), env)
    assert_one_line_error(proc, 2, "--create", "folder")
    assert moto.keys(bucket) == [] and _counts(platform_engine) == (0, 0)


# --------------------------------------------------------------------------- item 6: bad URLs


PREFIXES = [
    ("s3://{b}/../x", "'..'"),
    ("s3://{b}/a/../x", "'..'"),
    ("s3://{b}/./x", "'.'"),
    ("s3://{b}/a/.", "'.'"),
    ("s3://{b}/..", "'..'"),
    ("s3://{b}//x", "starts with '/'"),
    ("s3://{b}/a//x", "empty"),
    ("s3://{b}/a\\x", "\\"),
    ("s3://{b}/a//", "empty"),
]

ENDPOINTS = [
    ("http://127.0.0.1:99999", ["port 99999", "1..65535"]),
    ("http://127.0.0.1:0", ["port 0", "1..65535"]),
    ("ftp://127.0.0.1:9000", ["http(s)://HOST[:PORT]"]),
    ("127.0.0.1:9000", ["http(s)://HOST[:PORT]"]),
    ("http://", ["http(s)://HOST[:PORT]"]),
    ("http://:9000", ["http(s)://HOST[:PORT]"]),
    ("http://-bad-.example:9000", ["host '-bad-.example'"]),
    ("http://a..b:9000", ["host 'a..b'"]),
    ("http://[zz::1]:9000", ["host '[zz::1]'"]),
]


def test_a_prefix_with_dot_segments_or_a_leading_slash_is_refused(
    env: dict[str, str], platform_engine: Engine, moto: MotoServer
) -> None:
    bucket = moto.bucket(bucket_name("seg"))
    for url, needle in PREFIXES:
        url = url.format(b=bucket)
        assert_one_line_error(run_orbit(_s3(moto, url), env), 2, "prefix", needle)
        # --volume reads the same URL rules
        worker = run_orbit(["worker", "archive", "--volume", url, "--print-command"], env)
        assert_one_line_error(worker, 2, "prefix", needle)
    assert moto.keys(bucket) == [] and _counts(platform_engine) == (0, 0)
    # a trailing '/' is still the same prefix
    doc = _ok(run_orbit([*_s3(moto, f"s3://{bucket}/a/b/"), "--json"], env))
    assert doc["path"] == f"s3://{bucket}/a/b"
    assert moto.keys(bucket) == [f"a/b/{IDENTITY_FILE}"]


def test_a_bad_endpoint_is_exit_2_with_one_line_never_a_botocore_name(
    env: dict[str, str], platform_engine: Engine, moto: MotoServer
) -> None:
    bucket = moto.bucket(bucket_name("ep"))
    for endpoint, needles in ENDPOINTS:
        proc = run_orbit(_s3(moto, f"s3://{bucket}/p", endpoint=endpoint), env)
        line = assert_one_line_error(proc, 2, "endpoint", *needles)
        assert "Error" not in line and "botocore" not in line, line
    assert moto.keys(bucket) == [] and _counts(platform_engine) == (0, 0)


# --------------------------------------------------------------------------- item 2: nesting


def test_a_folder_storage_around_registered_volumes_is_refused(
    env: dict[str, str], platform_engine: Engine, tmp_path: Path
) -> None:
    mnt = tmp_path / "mnt"
    inner = _init(env, mnt / "disks" / "archive1", "--create", "--label", "a1")
    (mnt / "lost+found").mkdir()
    (mnt / "lost+found").chmod(0o000)  # a folder this user cannot list is skipped, not fatal
    try:
        for outer in (mnt, mnt / "disks"):
            before = _tree(mnt / "disks")
            proc = run_orbit(["storage", "init", str(outer), "--label", "outer"], env)
            assert_one_line_error(
                proc, 3, str(outer), str(mnt / "disks" / "archive1"), inner["id"],
                "registered", "cannot nest",
            )  # fmt: skip
            assert not (outer / IDENTITY_FILE).exists() and _tree(mnt / "disks") == before
        # a volume of another deployment (an identity not registered here) is refused alike
        foreign = new_id()
        write_identity(mnt / "other" / "vol", foreign, "theirs")
        proc = run_orbit(["storage", "init", str(mnt / "other")], env)
        assert_one_line_error(proc, 3, foreign.hex(), "not registered", "cannot nest")
    finally:
        (mnt / "lost+found").chmod(0o755)
    assert _counts(platform_engine) == (1, 0)
    # inside one is refused as before, and a sibling folder is fine
    inside = run_orbit(["storage", "init", str(mnt / "disks" / "archive1" / "x"), "--create"], env)
    assert_one_line_error(inside, 3, "inside", inner["id"])
    assert _init(env, mnt / "disks" / "archive2", "--create")["status"] == "created"


def test_a_folder_with_too_many_folders_to_check_is_refused(
    env: dict[str, str], platform_engine: Engine, tmp_path: Path
) -> None:
    big = tmp_path / "big"
    for i in range(1001):
        (big / f"d{i:04d}").mkdir(parents=True)
    proc = run_orbit(["storage", "init", str(big)], env)
    assert_one_line_error(proc, 3, str(big), "more than 1000 folders", "empty folder")
    assert not (big / IDENTITY_FILE).exists() and _counts(platform_engine) == (0, 0)


def test_an_s3_storage_around_registered_storages_is_refused(
    env: dict[str, str], platform_engine: Engine, moto: MotoServer
) -> None:
    bucket = moto.bucket(bucket_name("around"))
    inner = _ok(run_orbit([*_s3(moto, f"s3://{bucket}/team/a"), "--json"], env))
    for outer in (f"s3://{bucket}/team", f"s3://{bucket}"):
        proc = run_orbit(_s3(moto, outer), env)
        assert_one_line_error(proc, 3, outer, f"s3://{bucket}/team/a", inner["id"], "cannot nest")
    # the registry knows it on any endpoint (one bucket and prefix names one storage) ...
    proxy_endpoint = moto.endpoint.replace("127.0.0.1", "localhost")
    other = run_orbit(_s3(moto, f"s3://{bucket}/team", endpoint=proxy_endpoint), env)
    assert_one_line_error(other, 3, "holds the registered storage", inner["id"])
    # ... and an identity object another deployment wrote is found by listing
    theirs = new_id()
    moto.client().put_object(
        Bucket=bucket, Key=f"x/y/z/{IDENTITY_FILE}",
        Body=json.dumps({"format": "orbit-volume/1", "label": "", "storage_id": theirs.hex()}),
    )  # fmt: skip
    for outer in (f"s3://{bucket}/x", f"s3://{bucket}/x/y"):
        proc = run_orbit(_s3(moto, outer), env)
        assert_one_line_error(proc, 3, outer, f"s3://{bucket}/x/y/z", "cannot nest")
    assert moto.keys(bucket) == [f"team/a/{IDENTITY_FILE}", f"x/y/z/{IDENTITY_FILE}"]
    assert _counts(platform_engine) == (1, 1)
    # a sibling prefix is fine
    assert _ok(run_orbit([*_s3(moto, f"s3://{bucket}/team-b"), "--json"], env))["status"] == (
        "created"
    )


# --------------------------------------------------------------------------- item 4: options


def test_init_again_with_other_options_is_refused_naming_the_registered_ones(
    env: dict[str, str], platform_engine: Engine, moto: MotoServer, tmp_path: Path
) -> None:
    bucket = moto.bucket(bucket_name("opts"))
    url = f"s3://{bucket}/p"
    first = [*_s3(moto, url), "--label", "s3", "--storage-class", "STANDARD_IA", "--sse", "AES256"]
    created = _ok(run_orbit([*first, "--json"], env))
    again = _ok(run_orbit([*first, "--json"], env))  # the same options: idempotent
    assert (again["id"], again["status"]) == (created["id"], "existing")
    assert _ok(run_orbit([*_s3(moto, url), "--storage-class", "STANDARD_IA", "--sse", "AES256",
                          "--json"], env))["id"] == created["id"]  # fmt: skip

    other_class = run_orbit([*_s3(moto, url), "--storage-class", "GLACIER_IR", "--sse", "AES256"],
                            env)  # fmt: skip
    assert_one_line_error(
        other_class, 3, created["id"], "--storage-class STANDARD_IA (given GLACIER_IR)"
    )
    several = run_orbit(
        ["storage", "init", url, "--endpoint", moto.endpoint, "--region", "eu-west-1"], env
    )
    line = assert_one_line_error(several, 3, "--region us-east-1 (given eu-west-1)",
                                 "--path-style on (given off)",
                                 "--storage-class STANDARD_IA (given none)",
                                 "--sse AES256 (given none)")  # fmt: skip
    assert "--endpoint" not in line
    localhost = moto.endpoint.replace("127.0.0.1", "localhost")  # the same server, other name
    renamed = run_orbit(
        [*_s3(moto, url, endpoint=localhost), "--storage-class", "STANDARD_IA", "--sse", "AES256"],
        env,
    )
    assert_one_line_error(renamed, 3, f"--endpoint {moto.endpoint} (given {localhost})")
    relabel = run_orbit([*_s3(moto, url), "--label", "other"], env)
    assert_one_line_error(relabel, 3, created["id"], "--label 's3'", "'other'")
    with platform_engine.connect() as conn:
        loc = store.object_location(conn, bytes.fromhex(created["id"]))
    assert loc is not None and (loc["endpoint"], loc["storage_class"], loc["sse"]) == (
        moto.endpoint, "STANDARD_IA", "AES256",
    )  # fmt: skip
    assert _counts(platform_engine) == (1, 1)

    # a folder: the label is its one option
    vol = tmp_path / "vol"
    folder = _init(env, vol, "--create", "--label", "disk-a")
    assert _init(env, vol, "--label", "disk-a")["status"] == "existing"
    proc = run_orbit(["storage", "init", str(vol), "--label", "disk-b"], env)
    assert_one_line_error(proc, 3, folder["id"], "--label 'disk-a'", "'disk-b'")
    assert read_identity(vol).label == "disk-a"


# --------------------------------------------------------------------------- item 5: endpoints


def test_one_bucket_and_prefix_is_registered_under_one_endpoint(
    env: dict[str, str], platform_engine: Engine, moto: MotoServer, tmp_path: Path
) -> None:
    bucket = moto.bucket(bucket_name("twice"))
    url = f"s3://{bucket}/p"
    first = _ok(run_orbit([*_s3(moto, url), "--json"], env))
    with (
        mariadb_database("orbit_s3twin") as other_url,
        migrated_engine(other_url, "platform"),
    ):
        # a second object store: another moto server with the same bucket and prefix
        from tests.support.s3 import start_moto

        second = start_moto(tmp_path / "moto2.log")
        try:
            second_env = orbit_env(other_url, **moto.env())  # moto accepts any credentials
            client = second.client()
            client.create_bucket(Bucket=bucket)
            proc = run_orbit(_s3(moto, url, endpoint=second.endpoint), env)
            line = assert_one_line_error(proc, 3, url, first["id"], moto.endpoint,
                                         "registered once")  # fmt: skip
            assert "storage init" not in line.replace("orbit storage list", ""), line
            assert second.keys(bucket) == [] and _counts(platform_engine) == (1, 1)

            # a pair registered before issue 27 (by hand here): --volume URL is ambiguous and
            # says how to name one; --volume STORAGE_ID opens each
            twin = _ok(run_orbit([*_s3(second, url), "--json"], second_env))
            # nor adopted here: the other endpoint's identity under a taken bucket and prefix
            adopt = run_orbit([*_s3(moto, url, endpoint=second.endpoint), "--adopt"], env)
            assert_one_line_error(adopt, 3, first["id"], "registered once")
            assert _counts(platform_engine) == (1, 1)
            with platform_engine.begin() as conn:
                store.register_storage(conn, bytes.fromhex(twin["id"]), "")
                store.register_object_location(
                    conn, bytes.fromhex(twin["id"]),
                    {"bucket": bucket, "prefix": "p", "endpoint": second.endpoint,
                     "region": REGION, "path_style": True, "storage_class": "", "sse": "",
                     "kms_key_id": ""},
                )  # fmt: skip
            worker = run_orbit(["worker", "archive", "--volume", url, "--print-command"], env)
            assert_one_line_error(worker, 3, first["id"], twin["id"], "id of the storage")
            for sid in (first["id"], twin["id"]):
                proc = run_orbit(["worker", "archive", "--volume", sid, "--print-command"], env)
                assert proc.returncode == 0, proc.stderr
                assert f"orbit.archive.{sid}" in proc.stdout, proc.stdout
        finally:
            second.proc.terminate()
            second.proc.wait(timeout=10)


# --------------------------------------------------------------------------- item 3: hints


def test_hints_name_the_safe_step_never_storage_init(
    env: dict[str, str], platform_engine: Engine, moto: MotoServer, tmp_path: Path
) -> None:
    bucket = moto.bucket(bucket_name("hint"))
    _ok(run_orbit([*_s3(moto, f"s3://{bucket}/archive"), "--json"], env))
    # a typo'd prefix given to --volume
    typo = run_orbit(
        ["worker", "archive", "--volume", f"s3://{bucket}/archiv", "--print-command"], env
    )
    line = assert_one_line_error(typo, 4, "check the bucket, the prefix", "orbit storage list")
    assert "storage init" not in line, line
    # another deployment's storage: an identity object not registered here
    with mariadb_database("orbit_s3hint") as other_url, migrated_engine(other_url, "platform"):
        other_env = orbit_env(other_url, **moto.env())
        proc = run_orbit(_s3(moto, f"s3://{bucket}/archive"), other_env)
        line = assert_one_line_error(proc, 3, "ORBIT_DATABASE_URL", "must not be adopted",
                                     "A storage that is not registered here")  # fmt: skip
        assert "storage init" not in line and "--adopt registers" not in line, line
    # a folder volume of another deployment given to the worker
    foreign = tmp_path / "foreign"
    write_identity(foreign, new_id(), "theirs")
    proc = run_orbit(["worker", "archive", "--volume", str(foreign), "--print-command"], env)
    line = assert_one_line_error(proc, 4, "ORBIT_DATABASE_URL", "STORAGE_MISMATCH")
    assert "storage init" not in line, line
    # an unmounted volume given to the worker
    empty = tmp_path / "mnt-archive1"
    empty.mkdir()
    proc = run_orbit(["worker", "archive", "--volume", str(empty), "--print-command"], env)
    line = assert_one_line_error(proc, 2, "is the volume mounted")
    assert "storage init" not in line, line
    # the runbook has the section the hints name
    runbook = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    assert "### A storage that is not registered here" in runbook
    assert "### STORAGE_MISMATCH" in runbook
