"""A real S3-compatible HTTP server on loopback for the S3 storage tests (issue 18): moto's
server (``python -m moto.server``, PyPI ``moto[server]``) in its own process, no in-process
patching of the client. Credentials reach our code only through the standard AWS chain (the
environment); the secret is random per session, so a test can grep logs and databases for it.

What moto checks (probed in ``test_moto_honours_conditional_put``): it refuses a second
``PutObject`` with ``If-None-Match: *`` (412), and it stores and returns the
``x-amz-checksum-sha256`` it was sent -- but it does not recompute it (a wrong value is accepted),
so the server-side checksum check itself is AWS's (and MinIO's), not tested here.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from botocore.config import Config

REGION = "us-east-1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class MotoServer:
    endpoint: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    access_key: str
    secret_key: str

    def env(self) -> dict[str, str]:
        """The standard AWS chain, isolated from the machine's own config and instance role."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self, endpoint: str | None = None) -> Any:
        return boto3.client(
            "s3",
            endpoint_url=endpoint or self.endpoint,
            region_name=REGION,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=Config(
                s3={"addressing_style": "path"},
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )

    def bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = (
            self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        )
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def init_args(self, url: str, endpoint: str | None = None) -> list[str]:
        """``orbit storage init URL`` with this server's endpoint."""
        return [
            "storage", "init", url, "--endpoint", endpoint or self.endpoint, "--region", REGION,
            "--path-style",
        ]  # fmt: skip


def start_moto(log: Path) -> MotoServer:
    port = free_port()
    fh = log.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=fh,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    fh.close()
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(endpoint + "/moto-api/", timeout=1)
            break
        except httpx.HTTPError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"moto server did not start: {log.read_text()}") from None
            time.sleep(0.1)
    return MotoServer(
        endpoint, port, proc, log, "AKIAORBITTEST" + secrets.token_hex(4).upper(),
        "orbitSecret" + secrets.token_urlsafe(24),
    )  # fmt: skip


@pytest.fixture(scope="session", name="moto")
def moto_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    server = start_moto(tmp_path_factory.mktemp("moto") / "moto.log")
    try:
        yield server
    finally:
        server.proc.terminate()
        try:
            server.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait(timeout=10)


def bucket_name(tag: str) -> str:
    """A fresh valid bucket name per test."""
    return f"orbit-{tag}-{secrets.token_hex(4)}"
