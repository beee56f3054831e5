"""docs/archive-format.md stays true: its hand-verification script (bash, sha256sum, zcat, jq)
accepts a format-1 job written by the old code and a format-2 chain, and names the file of a
flipped byte; its jq column listing matches the table."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from orbit_tasks.archive.format import names as file_names
from orbit_tasks.archive.format import values as fv
from orbit_tasks.platform.history import HISTORY_KINDS
from tests.support.archive_chain import T0, UNTIL, build_chain, manifest, rid
from tests.support.restore import FIXTURE, fixture_rows
from tests.support.s3 import REGION, MotoServer, bucket_name
from tests.support.s3 import moto_fixture as moto_fixture  # the session's S3 server

DOC = Path(__file__).resolve().parents[2] / "docs" / "archive-format.md"


def _script(tmp: Path, name: str = "verify-job.sh") -> Path:
    text = DOC.read_text(encoding="utf-8")
    block = text.split(f"<!-- {name}", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    path = tmp / name
    path.write_text(block, encoding="utf-8")
    return path


def _run(script: Path, directory: Path, last: str) -> subprocess.CompletedProcess[str]:
    for tool in ("bash", "sha256sum", "zcat", "jq"):
        assert shutil.which(tool), f"{tool} must be on the machine (docs/archive-format.md)"
    return subprocess.run(
        ["bash", str(script), str(directory), last], capture_output=True, text=True, timeout=60
    )


def _write(files: list[tuple[str, bytes]], directory: Path) -> Path:
    directory.mkdir(parents=True)
    for name, data in files:
        (directory / name).write_bytes(data)
    return directory


def test_the_documented_script_verifies_format_1_and_2(tmp_path: Path) -> None:
    script = _script(tmp_path)
    job = fixture_rows("platform-rows.json")["orbit_archive_jobs"][0]
    old = FIXTURE / "volume" / job["namespace_id"].hex() / job["id"].hex()
    done = _run(script, old, job["last_sha256"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == f"ok: 3 batches, 11 roots, last link {job['last_sha256']}"

    chain = build_chain()
    new = _write(chain.files, tmp_path / "v2")
    done = _run(script, new, chain.expect.last_sha256)
    assert done.returncode == 0 and done.stdout.startswith("ok: 3 batches, 5 roots"), done.stdout
    assert _run(script, new, "0" * 64).stdout.startswith("BAD ")

    broken = _write(chain.files, tmp_path / "flipped")
    middle = broken / chain.name(2)
    data = bytearray(middle.read_bytes())
    data[len(data) // 2] ^= 0x01
    middle.write_bytes(bytes(data))
    done = _run(script, broken, chain.expect.last_sha256)
    assert done.returncode == 1 and done.stdout.startswith(f"BAD {chain.name(2)}:"), done.stdout

    keyed = build_chain(range_from=T0, range_from_id=rid(1))  # a key bound (SPEC §5 catch-up)
    done = _run(script, _write(keyed.files, tmp_path / "keyed"), keyed.expect.last_sha256)
    assert done.returncode == 0 and done.stdout.startswith("ok: 3 batches, 5 roots"), done.stdout
    assert json.loads(keyed.data(0))["range"]["from_id"] == rid(1).hex()

    empty = manifest(roots_total=0, range_from=UNTIL, range_until=UNTIL)
    sha = fv.sha256_hex(empty)
    only = _write([(file_names.manifest_name(sha), empty)], tmp_path / "empty")
    done = _run(script, only, sha)
    assert done.returncode == 0 and done.stdout.startswith("ok: 0 batches, 0 roots"), done.stdout


def test_the_documented_jq_column_listing(tmp_path: Path) -> None:
    chain = build_chain()
    directory = _write(chain.files, tmp_path / "v2")
    out = subprocess.run(
        ["jq", "-r", ".source.columns[] | [.name, .type, .nullable, .encoding] | @tsv",
         str(directory / chain.name(0))],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    names = [line.split("\t")[0] for line in out.splitlines()]
    assert names == [c.name for c in HISTORY_KINDS["tasks"].root.columns]
    assert "request_json\tMEDIUMTEXT\tfalse\ttext" in out
    assert json.loads(chain.data(0))["format"] == "orbit-archive/2"


def test_the_documented_s3_download_then_the_script(tmp_path: Path, moto: MotoServer) -> None:
    """An S3 archive by hand (issue 18): the doc's boto3 download of a job prefix from a real
    S3 server, then the same script; a flipped byte in a middle object is named."""
    chain = build_chain()
    client = moto.client()
    bucket = moto.bucket(bucket_name("doc"))
    prefix = f"archive/{'ab' * 16}/{'cd' * 16}/"
    for name, data in chain.files:
        client.put_object(Bucket=bucket, Key=prefix + name, Body=data)
    download, verify = _script(tmp_path, "s3-download.sh"), _script(tmp_path)
    env = {**os.environ, **moto.env(), "S3_ENDPOINT": moto.endpoint, "AWS_DEFAULT_REGION": REGION,
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # fmt: skip
    subprocess.run(["bash", str(download), bucket, prefix, str(tmp_path / "job")], env=env,
                   check=True, timeout=60)  # fmt: skip
    done = _run(verify, tmp_path / "job", chain.expect.last_sha256)
    assert done.returncode == 0 and done.stdout.startswith("ok: 3 batches, 5 roots"), done.stdout
    data = bytearray(dict(chain.files)[chain.name(2)])
    data[len(data) // 2] ^= 0x01
    client.put_object(Bucket=bucket, Key=prefix + chain.name(2), Body=bytes(data))
    subprocess.run(["bash", str(download), bucket, prefix, str(tmp_path / "again")], env=env,
                   check=True, timeout=60)  # fmt: skip
    done = _run(verify, tmp_path / "again", chain.expect.last_sha256)
    assert done.returncode == 1 and done.stdout.startswith(f"BAD {chain.name(2)}:"), done.stdout
