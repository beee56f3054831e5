"""The pure rules of S3 storages (issue 18): URLs, write options, which faults are retried,
the backoff, and how workers are handed their storages."""

from __future__ import annotations

from pathlib import Path

import pytest
from billiard.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded
from botocore.exceptions import ClientError as BotoClientError
from botocore.exceptions import (
    ConnectionClosedError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)

from orbit_tasks.archive.engine.objects import _Client, backoff, fault_of
from orbit_tasks.archive.engine.storage import parse_volumes, volumes_env
from orbit_tasks.archive.s3_locations import (
    S3Location,
    check_options,
    location_from_json,
    parse_s3_url,
)
from orbit_tasks.errors import InvalidInput


def _client_error(code: str, status: int) -> BotoClientError:
    return BotoClientError(
        {"Error": {"Code": code, "Message": "x"}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "PutObject",
    )


@pytest.mark.parametrize(
    ("url", "bucket", "prefix"),
    [
        ("s3://orbit-archive", "orbit-archive", ""),
        ("s3://orbit-archive/", "orbit-archive", ""),
        ("s3://orbit-archive/a/b/", "orbit-archive", "a/b"),
        ("S3://orbit.archive/x", "orbit.archive", "x"),
    ],
)
def test_s3_urls(url: str, bucket: str, prefix: str) -> None:
    assert parse_s3_url(url) == (bucket, prefix)


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("s3://", "names no bucket"),
        ("s3:///p", "names no bucket"),
        ("s3://Upper/p", "not a valid S3 bucket name"),
        ("s3://ab/p", "not a valid S3 bucket name"),
        ("s3://a..b/p", "not a valid S3 bucket name"),
        ("s3://bucket/a//b", "empty path segment"),
        ("s3://bucket/a b", "characters outside"),
        ("s3://bucket/" + "p" * 513, "allowed 0..512"),
        ("/mnt/archive", "not an s3:// URL"),
    ],
)
def test_bad_s3_urls_name_the_value(url: str, needle: str) -> None:
    with pytest.raises(InvalidInput, match=needle):
        parse_s3_url(url)


def test_write_options() -> None:
    check_options(S3Location("b", storage_class="STANDARD_IA", sse="aws:kms", kms_key_id="k"))
    for loc, needle in [
        (S3Location("b", storage_class="COLD"), "storage class"),
        (S3Location("b", sse="rot13"), "SSE mode"),
        (S3Location("b", kms_key_id="k"), "needs SSE mode aws:kms"),
        (S3Location("b", endpoint="minio:9000"), "http"),
        (S3Location("b", endpoint="http://minio:9000/path"), "without a path"),
    ]:
        with pytest.raises(InvalidInput, match=needle):
            check_options(loc)


@pytest.mark.parametrize(
    ("exc", "fault"),
    [
        (_client_error("SlowDown", 503), "transient"),
        (_client_error("InternalError", 500), "transient"),
        (_client_error("ServiceUnavailable", 503), "transient"),
        (_client_error("503", 503), "transient"),
        (_client_error("TooManyRequests", 429), "transient"),
        (_client_error("RequestTimeout", 400), "transient"),
        (_client_error("ConditionalRequestConflict", 409), "transient"),
        (_client_error("AccessDenied", 403), "denied"),
        (_client_error("InvalidAccessKeyId", 403), "denied"),
        (_client_error("403", 403), "denied"),
        (_client_error("NoSuchBucket", 404), "no_bucket"),
        (_client_error("NoSuchKey", 404), "missing"),
        (_client_error("404", 404), "missing"),
        (_client_error("PreconditionFailed", 412), "exists"),
        (_client_error("InvalidRequest", 400), "other"),
        (NoCredentialsError(), "denied"),
        (EndpointConnectionError(endpoint_url="http://x"), "transient"),
        (ConnectionClosedError(endpoint_url="http://x"), "transient"),
        (ReadTimeoutError(endpoint_url="http://x"), "transient"),
        (ValueError("not ours"), "other"),
    ],
)
def test_which_faults_are_retried(exc: Exception, fault: str) -> None:
    assert fault_of(exc) == fault


def test_backoff_is_capped_with_full_jitter() -> None:
    assert backoff(0, rnd=0.999) < 0.05 and backoff(0, rnd=0.0) == 0.0
    assert backoff(3, rnd=0.5) == pytest.approx(0.5 * 0.4)
    assert backoff(40, rnd=0.999) < 2.0  # capped, no overflow


def test_workers_are_handed_folders_and_s3_locations() -> None:
    loc = S3Location("orbit-archive", "p", "http://minio:9000", "us-east-1", True, "", "AES256")
    places = {"aa" * 16: Path("/mnt/a"), "bb" * 16: loc}
    assert parse_volumes(volumes_env(places)) == places
    assert location_from_json(loc.to_json()) == loc
    with pytest.raises(InvalidInput, match="neither a path"):
        location_from_json({"gcs": {}})
    with pytest.raises(InvalidInput, match="SSE mode"):
        location_from_json({"s3": {"bucket": "b", "sse": "x"}})


@pytest.mark.parametrize("limit", [SoftTimeLimitExceeded, TimeLimitExceeded])
def test_a_time_limit_is_never_an_io_fault(limit: type[Exception]) -> None:
    """Celery's time limits derive from ``Exception``: the retry loop around an S3 request
    must let them through as they are (the task lets the lease expire), never word them as an
    ``ArchiveIOError`` (job code ``IO_ERROR``, a failed job) (issue 24 item 4)."""
    assert fault_of(limit()) == "time_limit"
    client = _Client(S3Location("orbit-archive", region="us-east-1"), retry_seconds=5)
    calls = []

    def request(_client: object) -> None:
        calls.append(1)
        raise limit()

    with pytest.raises(limit):
        client.call("GetObject", "x", request)
    assert calls == [1]  # not retried either
