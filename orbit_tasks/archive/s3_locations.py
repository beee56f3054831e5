"""Where an S3 storage lives (issue 18, issue 26 item 4): ``s3://BUCKET/PREFIX`` URLs, the
checked :class:`S3Location`, its key names and its per-storage write options. Pure: no boto3,
no I/O; the retrying client is ``archive/engine/objects.py``.

Layout: ``PREFIX/.orbit-volume.json`` is the identity object and
``PREFIX/<ns_hex>/<job_hex>/<name>`` the job files, named as on a volume. A location is not a
secret: URLs with user info, and endpoints with user info, a path or a query, are refused
(credentials come only from the AWS chain), and their messages show them redacted
(:mod:`orbit_tasks.redaction`).
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from orbit_tasks.errors import InvalidInput
from orbit_tasks.redaction import redact_url

SCHEME = "s3://"
MAX_PREFIX = 512
STORAGE_CLASSES = (
    "STANDARD",
    "STANDARD_IA",
    "ONEZONE_IA",
    "INTELLIGENT_TIERING",
    "GLACIER_IR",
    "REDUCED_REDUNDANCY",
)
SSE_MODES = ("", "AES256", "aws:kms")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_PREFIX_CHAR = re.compile(r"^[A-Za-z0-9!_.*'()/-]*$")
#: http(s)://HOST[:PORT][/]: a DNS name, an IPv4 or a bracketed IPv6 address; no user info, path,
#: query or fragment (a credential in the URL would be stored in the registry and printed)
_ENDPOINT = re.compile(r"^https?://([A-Za-z0-9.-]+|\[[0-9A-Za-z:.]+\])(?::([0-9]{1,5}))?/?$")
#: One DNS label: 1..63 letters, digits and hyphens, not starting or ending with a hyphen.
_LABEL = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
MIN_PORT, MAX_PORT = 1, 65535
#: What a prefix may hold (the words of the refusals).
_PREFIX_RULE = (
    "allowed: '/'-separated segments of A-Z a-z 0-9 ! _ . * ' ( ) -, "
    "none empty, '.' or '..', no leading '/'"
)


@dataclass(frozen=True)
class S3Location:
    """Where an S3 storage lives and how its objects are written. Not a secret: recorded with
    the storage at ``storage init`` and handed to workers in ``ORBIT_ARCHIVE_VOLUMES``."""

    bucket: str
    prefix: str = ""  # no leading or trailing '/'; "" = the bucket's root
    endpoint: str = ""  # "" = the AWS endpoint of the region (or the AWS config's)
    region: str = ""  # "" = the AWS chain's region
    path_style: bool = False
    storage_class: str = ""  # "" = the bucket's default (STANDARD)
    sse: str = ""  # "", "AES256" (SSE-S3) or "aws:kms" (SSE-KMS)
    kms_key_id: str = ""  # with sse "aws:kms"; "" = the account's default key

    @property
    def url(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}" if self.prefix else f"{SCHEME}{self.bucket}"

    def key(self, name: str) -> str:
        """The key of ``name`` under the prefix."""
        return f"{self.prefix}/{name}" if self.prefix else name

    def url_of(self, key: str) -> str:
        """``s3://BUCKET/KEY`` of a key (for messages)."""
        return f"{SCHEME}{self.bucket}/{key}"

    def job_prefix(self, namespace_id: bytes, job_id: bytes) -> str:
        """``PREFIX/<ns_hex>/<job_hex>/``: where a job's files live (named as on a volume)."""
        return self.key(f"{namespace_id.hex()}/{job_id.hex()}/")

    def to_json(self) -> dict[str, Any]:
        return {"s3": asdict(self)}


def is_s3_url(text: str) -> bool:
    return text.lower().startswith(SCHEME)


def parse_s3_url(text: str) -> tuple[str, str]:
    """``s3://BUCKET[/PREFIX]`` -> (bucket, prefix without the slashes around it)."""
    if not is_s3_url(text):
        raise InvalidInput(f"{text!r} is not an s3:// URL (s3://BUCKET/PREFIX)")
    rest = text[len(SCHEME) :]
    bucket, _, prefix = rest.partition("/")
    if "@" in bucket:
        raise InvalidInput(
            f"{redact_url(text)!r} carries user info (s3://BUCKET/PREFIX; credentials come only "
            "from the AWS chain)"
        )
    if not bucket:
        raise InvalidInput(f"{text!r} names no bucket (s3://BUCKET/PREFIX)")
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise InvalidInput(
            f"bucket {bucket!r} is not a valid S3 bucket name (3..63 lowercase letters, digits, "
            "dots and hyphens, starting and ending with a letter or digit)"
        )
    if prefix.startswith("/"):
        raise InvalidInput(f"prefix {prefix!r} starts with '/' ({_PREFIX_RULE})")
    prefix = prefix.removesuffix("/")  # s3://BUCKET/PREFIX/ names the same prefix
    check_prefix(prefix)
    return bucket, prefix


def check_prefix(prefix: str) -> None:
    """A storage's key prefix: ``""`` (the bucket's root) or ``/``-separated segments, none
    empty, ``.`` or ``..`` (a reader resolving them would find another prefix's objects), of
    the characters S3 calls safe; at most :data:`MAX_PREFIX` characters."""
    if len(prefix) > MAX_PREFIX:
        raise InvalidInput(f"prefix is {len(prefix)} characters long (allowed 0..{MAX_PREFIX})")
    if not prefix:
        return
    if prefix.startswith("/"):
        raise InvalidInput(f"prefix {prefix!r} starts with '/' ({_PREFIX_RULE})")
    if not _PREFIX_CHAR.match(prefix):
        raise InvalidInput(
            f"prefix {prefix!r} holds characters outside A-Z a-z 0-9 ! _ . * ' ( ) - /"
        )
    for segment in prefix.split("/"):
        if segment in ("", ".", ".."):
            what = "an empty path segment" if not segment else f"a {segment!r} path segment"
            raise InvalidInput(f"prefix {prefix!r} holds {what} ({_PREFIX_RULE})")


def check_endpoint(endpoint: str) -> None:
    """``--endpoint``: ``http(s)://HOST[:PORT]`` with a DNS name, an IPv4 or a bracketed IPv6
    address and a port of 1..65535; no user info, path, query or fragment. Shown redacted."""
    match = _ENDPOINT.match(endpoint)
    if match is None:
        if "@" in endpoint.split("?", 1)[0].split("#", 1)[0]:
            raise InvalidInput(
                f"endpoint {redact_url(endpoint)!r} carries user info (credentials come "
                "only from the AWS chain, never from the endpoint)"
            )
        raise InvalidInput(
            f"endpoint {redact_url(endpoint)!r} is not an http(s)://HOST[:PORT] URL "
            "without a path or query"
        )
    host, port = match.group(1), match.group(2)
    if not _valid_host(host):
        raise InvalidInput(
            f"endpoint {endpoint!r} names the host {host!r}, which is not a DNS name, an IPv4 "
            "address or a bracketed IPv6 address"
        )
    if port is not None and not MIN_PORT <= int(port) <= MAX_PORT:
        raise InvalidInput(
            f"endpoint {endpoint!r} has port {int(port)} (allowed {MIN_PORT}..{MAX_PORT})"
        )


def _valid_host(host: str) -> bool:
    if host.startswith("["):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return False
        return True
    labels = host.removesuffix(".").split(".")
    return len(host) <= 253 and all(_LABEL.match(label) for label in labels)


def location_from_json(doc: Mapping[str, Any]) -> S3Location:
    """An :class:`S3Location` from ``{"s3": {...}}`` (``ORBIT_ARCHIVE_VOLUMES``)."""
    inner = doc.get("s3")
    if not isinstance(inner, Mapping):
        raise InvalidInput("an ORBIT_ARCHIVE_VOLUMES entry is neither a path nor {'s3': {...}}")
    fields = {k: inner[k] for k in S3Location.__dataclass_fields__ if k in inner}
    try:
        loc = S3Location(**fields)
    except TypeError:
        raise InvalidInput("an ORBIT_ARCHIVE_VOLUMES s3 entry has no bucket") from None
    check_options(loc)
    return loc


def check_options(loc: S3Location) -> None:
    """The per-storage write options of ``storage init`` (the values, not the server's say)."""
    if loc.storage_class and loc.storage_class not in STORAGE_CLASSES:
        raise InvalidInput(
            f"storage class {loc.storage_class!r} is not allowed "
            f"(allowed: {', '.join(STORAGE_CLASSES)})"
        )
    if loc.sse not in SSE_MODES:
        raise InvalidInput(f"SSE mode {loc.sse!r} is not allowed (allowed: AES256, aws:kms)")
    if loc.kms_key_id and loc.sse != "aws:kms":
        raise InvalidInput("a KMS key id needs SSE mode aws:kms")
    if loc.endpoint:
        check_endpoint(loc.endpoint)
    check_prefix(loc.prefix)


def location_doc(loc: S3Location) -> str:
    return json.dumps(loc.to_json(), sort_keys=True)


#: The write and access options of a location that ``storage init`` records (not the place).
OPTION_FIELDS = ("endpoint", "region", "path_style", "storage_class", "sse", "kms_key_id")


def differing_options(registered: S3Location, given: S3Location) -> list[str]:
    """The option fields in which ``given`` differs from the ``registered`` location of the same
    storage (issue 27: ``storage init`` again with other options is refused, not ignored)."""
    return [f for f in OPTION_FIELDS if getattr(registered, f) != getattr(given, f)]
