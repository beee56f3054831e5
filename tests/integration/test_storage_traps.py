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
