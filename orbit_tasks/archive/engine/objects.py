"""Archive storages on S3-compatible object storage (issue 18): ``s3://BUCKET/PREFIX`` with the
guarantees of a volume (SPEC §5, docs/archive-jobs.md "Object storage").

Layout: ``PREFIX/.orbit-volume.json`` is the identity object (the bytes of a folder's identity
file) and ``PREFIX/<ns_hex>/<job_hex>/<name>`` the job files, named as on a volume; the location
rules (URLs, key names, write options) are pure, in ``archive/s3_locations.py``.

* A chain file is durable when one ``PutObject`` of its final content-addressed key succeeded
  with ``If-None-Match: *`` (an existing key is never replaced; a second writer gets 412 and
  compares the bytes, as a folder's ``link`` does) and ``x-amz-checksum-sha256`` (the server
  checks the body against it). The identity object is created the same way, so of two
  ``storage init`` runs on one prefix exactly one identity wins. A created object is known
  stored before it counts as written (issue 24): the PUT's answer carries our checksum back,
  else a HEAD finds our size and checksum; a server that answered 200 without storing gets
  the PUT again (:func:`put_if_absent`).
* Listing (``ListObjectsV2``, paginated) is done only where a folder is listed: a takeover and
  the final step (and ``orbit job verify|export|restore``); never per batch.
* A stale writer's removal (step 6) deletes the key only when no claim can confirm that name
  any more (``claims.unconfirmed_file_fate``: there is no inode to fence a delete on, and a
  claim may have found the object under its own name); then the caller re-checks the job row
  and puts the same bytes back if that name got confirmed meanwhile (a guard: the bytes of a
  content-addressed name are the same whoever wrote them).
* Faults: throttling (``SlowDown``, 429), 5xx, timeouts and connection resets are retried with
  capped exponential backoff and full jitter for at most ``retry_seconds`` per request (the
  runner passes a third of the lease); then :class:`StorageUnavailable` (the runner stops and
  lets the lease expire, like a transient database fault). Access denied / no credentials ->
  :class:`StorageDenied` (job code ``ACCESS_DENIED``), a missing bucket ->
  :class:`NoSuchBucket` (``NO_SUCH_BUCKET``), anything else -> :class:`ArchiveIOError`.

Credentials come only from the standard AWS chain of ``boto3`` (environment, shared config and
credentials files, container or instance role); this module never reads, stores, logs or prints
one. Messages name the bucket, key and S3 error code, never a header, a signature or a body.
"""

from __future__ import annotations

import base64
import binascii
import enum
import logging
import random
import threading
import time
from collections.abc import Callable, Collection, Hashable, Mapping
from pathlib import PurePosixPath
from typing import Any, TypeVar

from orbit_tasks import failpoints
from orbit_tasks.archive.engine.volume import (
    IDENTITY_FILE,
    NEST_SCAN_LIMIT,
    ArchiveIOError,
    FileConflict,
    NestScanTooLarge,
    StoredFile,
    VolumeIdentity,
    check_chain_name,
    identity_document,
    parse_identity,
)
from orbit_tasks.archive.format.values import sha256_hex
from orbit_tasks.archive.s3_locations import S3Location
from orbit_tasks.backoff import full_jitter
from orbit_tasks.errors import ConflictError, InvalidInput, OrbitError
from orbit_tasks.logs import log_action

log = logging.getLogger("orbit.archive.engine.objects")

#: The retry pauses of one request: full jitter over ``min(CAP, BASE * 2**attempt)`` seconds.
RETRY_BASE_SECONDS = 0.05
RETRY_CAP_SECONDS = 2.0

#: S3 error codes of a refused identity or permission (job code ACCESS_DENIED).
DENIED_CODES = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidToken",
        "ExpiredToken",
        "TokenRefreshRequired",
        "AccountProblem",
        "InvalidSecurity",
    }
)
#: S3 error codes worth another try (with the 5xx statuses and 429).
TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "InternalError",
        "ServiceUnavailable",
        "OperationAborted",
        "ConditionalRequestConflict",
        "RequestLimitExceeded",
        "TooManyRequests",
    }
)
#: botocore transport errors (by class, through the MRO): reset, timeout, refused, truncated.
TRANSIENT_TRANSPORT = frozenset(
    {"ConnectionError", "HTTPClientError", "IncompleteReadError", "ProtocolError"}
)
#: Celery's (billiard's) time limits, raised into the task by a signal while a request runs:
#: they derive from ``Exception`` but are no I/O fault (issue 24 item 4: a time limit worded
#: as ``IO_ERROR`` failed a large job's final step on every retry). By name, through the MRO:
#: this module does not import Celery.
TIME_LIMITS = frozenset({"SoftTimeLimitExceeded", "TimeLimitExceeded"})
#: botocore's "no (usable) credentials in the chain".
NO_CREDENTIALS = frozenset(
    {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"}
)


class StorageDenied(ArchiveIOError):
    """The object store refused our identity or permission, or the chain has no credentials
    (job code ``ACCESS_DENIED``)."""


class NoSuchBucket(ArchiveIOError):
    """The bucket does not exist (job code ``NO_SUCH_BUCKET``)."""

    exit_code = 4


class StorageUnavailable(OrbitError):
    """The object store kept failing transiently for the whole retry budget: not a job failure
    (the runner stops; the lease expires and a claim tries again)."""


# --------------------------------------------------------------------------- faults (pure)


class Fault(enum.StrEnum):
    """What a botocore call's exception means to the retry loop."""

    TIME_LIMIT = "time_limit"  # Celery's time limit: passes through as it is
    TRANSIENT = "transient"  # retried within the budget
    DENIED = "denied"  # StorageDenied (ACCESS_DENIED)
    NO_BUCKET = "no_bucket"  # NoSuchBucket (NO_SUCH_BUCKET)
    MISSING = "missing"  # FileNotFoundError
    EXISTS = "exists"  # 412 on a conditional PUT: the caller's to handle
    OTHER = "other"  # ArchiveIOError


def fault_of(exc: BaseException) -> Fault:
    """The :class:`Fault` of an exception raised by a botocore call (pure: reads the error code
    and status only)."""
    names = {c.__name__ for c in type(exc).__mro__}
    if names & TIME_LIMITS:
        return Fault.TIME_LIMIT
    if names & NO_CREDENTIALS:
        return Fault.DENIED
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping):
        code = str(response.get("Error", {}).get("Code", ""))
        status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        if code in DENIED_CODES or (status == 403 and code in ("", "403", "Forbidden")):
            return Fault.DENIED
        if code == "NoSuchBucket":
            return Fault.NO_BUCKET
        if code in ("NoSuchKey", "404", "NotFound"):
            return Fault.MISSING
        if code in ("PreconditionFailed", "412"):
            return Fault.EXISTS
        if code in TRANSIENT_CODES or status == 429 or status >= 500:
            return Fault.TRANSIENT
        return Fault.OTHER
    if names & TRANSIENT_TRANSPORT:
        return Fault.TRANSIENT
    return Fault.OTHER


def error_code(exc: BaseException) -> str:
    """The S3 error code or the exception's class name (for messages and logs)."""
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping):
        code = response.get("Error", {}).get("Code")
        if code:
            return str(code)
    return type(exc).__name__


def backoff(attempt: int, *, rnd: float) -> float:
    """The pause before retry ``attempt + 1`` of a request (pure; the caller passes
    ``random.random()``): :func:`orbit_tasks.backoff.full_jitter` with this client's base and
    cap."""
    return full_jitter(attempt, base=RETRY_BASE_SECONDS, cap=RETRY_CAP_SECONDS, rnd=rnd)


# --------------------------------------------------------------------------- the client


T = TypeVar("T")


class _Client:
    """One boto3 client of a location, made on first use (thread-safe, shared by the runner's
    threads), and the retry loop around every call."""

    def __init__(self, loc: S3Location, retry_seconds: float) -> None:
        self.loc = loc
        self.retry_seconds = max(0.5, retry_seconds)
        self._client: Any = None
        self._lock = threading.Lock()

    def get(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = self._make()
            return self._client

    def _make(self) -> Any:
        # Imported here: boto3 and botocore cost 160-220 ms (python -X importtime); only a
        # command or a worker that opens an S3 storage pays for them.
        import boto3
        from botocore.config import Config

        timeout = max(1.0, min(30.0, self.retry_seconds / 2))
        config = Config(
            connect_timeout=min(5.0, timeout),
            read_timeout=timeout,
            retries={"mode": "standard", "total_max_attempts": 1},  # ours: see call()
            s3={"addressing_style": "path" if self.loc.path_style else "auto"},
            request_checksum_calculation="when_required",  # we send the SHA-256 ourselves
            response_checksum_validation="when_required",
            user_agent_extra="orbit-tasks",
        )
        session = boto3.session.Session()
        return session.client(
            "s3",
            endpoint_url=self.loc.endpoint or None,
            region_name=self.loc.region or None,
            config=config,
        )

    def call(self, op: str, what: str, fn: Callable[[Any], T]) -> T:
        """``fn(client)`` retried on transient faults for at most ``retry_seconds``; permanent
        faults become this module's errors (``missing`` -> FileNotFoundError, ``exists`` is
        re-raised for the caller); a time limit passes through as it is."""
        deadline = time.monotonic() + self.retry_seconds
        attempt = 0
        while True:
            try:
                return fn(self.get())
            except Exception as exc:
                fault = fault_of(exc)
                if fault is Fault.TIME_LIMIT:
                    raise
                if fault is Fault.TRANSIENT:
                    pause = backoff(attempt, rnd=random.random())
                    if time.monotonic() + pause >= deadline:
                        log_action(
                            log, "archive.storage.unavailable", op=op,
                            target=what, code=error_code(exc), attempts=attempt + 1,
                        )  # fmt: skip
                        raise StorageUnavailable(
                            f"{what}: the object store did not answer {op} "
                            f"({error_code(exc)}) for {self.retry_seconds:g} s"
                        ) from None
                    log_action(
                        log, "archive.storage.retry", op=op, code=error_code(exc),
                        attempt=attempt + 1,
                    )  # fmt: skip
                    time.sleep(pause)
                    attempt += 1
                    continue
                raise self._permanent(exc, fault, op, what) from None

    def _permanent(self, exc: Exception, fault: Fault, op: str, what: str) -> BaseException:
        code = error_code(exc)
        if fault is Fault.DENIED:
            if code in NO_CREDENTIALS:
                return StorageDenied(
                    f"{what}: no AWS credentials found (environment, shared config or "
                    "instance role)"
                )
            return StorageDenied(f"{what}: access denied by the object store ({code} on {op})")
        if fault is Fault.NO_BUCKET:
            return NoSuchBucket(f"bucket {self.loc.bucket!r} does not exist ({self._where()})")
        if fault is Fault.MISSING:
            return FileNotFoundError(what)
        if fault is Fault.EXISTS:
            return _Exists(what)
        return ArchiveIOError(f"{what}: object store error {code} on {op}")

    def _where(self) -> str:
        return f"endpoint {self.loc.endpoint}" if self.loc.endpoint else "AWS"


class _Exists(Exception):
    """412 on a conditional PUT: the key exists (handled by the caller)."""


def _checksum(data: bytes) -> str:
    return base64.b64encode(bytes.fromhex(sha256_hex(data))).decode("ascii")


def _put_args(loc: S3Location) -> dict[str, str]:
    args: dict[str, str] = {}
    if loc.storage_class:
        args["StorageClass"] = loc.storage_class
    if loc.sse:
        args["ServerSideEncryption"] = loc.sse
    if loc.kms_key_id:
        args["SSEKMSKeyId"] = loc.kms_key_id
    return args


def _read_body(client: Any, bucket: str, key: str) -> bytes:
    response = client.get_object(Bucket=bucket, Key=key)
    body = response["Body"]
    try:
        return bytes(body.read())
    finally:
        body.close()


# --------------------------------------------------------------------------- storage and jobs


class S3Job:
    """One job's prefix ``PREFIX/<ns_hex>/<job_hex>/`` (the :class:`~storage.JobFiles` seam)."""

    def __init__(self, client: _Client, prefix: str) -> None:
        self._client = client
        self._loc = client.loc
        self.prefix = prefix  # ends with '/'

    @property
    def where(self) -> str:
        return self._loc.url_of(self.prefix.rstrip("/"))

    def _key(self, name: str) -> str:
        return self.prefix + name

    def _list(self, limit: int | None = None) -> list[str]:
        args: dict[str, Any] = {"Bucket": self._loc.bucket, "Prefix": self.prefix}
        if limit:
            args["MaxKeys"] = limit

        def page(client: Any) -> dict[str, Any]:
            return dict(client.list_objects_v2(**args))

        names: list[str] = []
        while True:
            resp = self._client.call("ListObjectsV2", self.where, page)
            names += [o["Key"][len(self.prefix) :] for o in resp.get("Contents", [])]
            token = resp.get("NextContinuationToken")
            if limit or not resp.get("IsTruncated") or not token:
                return sorted(names)
            args["ContinuationToken"] = token

    def exists(self) -> bool:
        return bool(self._list(limit=1))

    def names(self) -> list[str]:
        return self._list()

    def read(self, name: str) -> bytes:
        key = self._key(name)
        return self._client.call(
            "GetObject", name, lambda c: _read_body(c, self._loc.bucket, key)
        )  # fmt: skip

    def store(self, name: str, data: bytes) -> StoredFile:
        check_chain_name(name, data)
        key = self._key(name)
        created = put_if_absent(self._client, key, name, data)
        if not created:
            try:
                existing = self.read(name)
            except FileNotFoundError:
                existing = b""  # removed meanwhile: a conflict we cannot settle here
            if existing != data:
                raise FileConflict(f"{name} exists with other contents; left untouched")
        return StoredFile(PurePosixPath(key), created, None, data)

    def remove(self, names: Collection[str]) -> None:
        for name in names:
            key = self._key(name)

            def delete(c: Any, key: str = key) -> None:
                c.delete_object(Bucket=self._loc.bucket, Key=key)

            self._client.call("DeleteObject", name, delete)

    def replace_damaged(self, name: str, data: bytes) -> bool:
        """A missing key gets the conditional PUT; a key holding other bytes (read just before)
        is deleted first (S3 has no atomic replace under ``If-None-Match``)."""
        check_chain_name(name, data)
        try:
            current: bytes | None = self.read(name)
        except FileNotFoundError:
            current = None
        if current == data:
            return False
        if current is not None:
            self.remove([name])
        if not put_if_absent(self._client, self._key(name), name, data) and self.read(name) != data:
            raise FileConflict(f"{name} was written meanwhile with other contents; left untouched")
        return True

    def remove_if_unconfirmed(
        self, name: str, confirmed: Collection[str], stored: StoredFile
    ) -> bool:
        if name in confirmed:
            return False
        self.remove([name])
        return True


class S3NamedFiles(S3Job):
    """Files under a prefix whose content-addressed names their caller checks (the id index of
    a job beside its prefix, issue 28): stored by the same conditional, checksummed PUT, but
    not restricted to chain names."""

    def store(self, name: str, data: bytes) -> StoredFile:
        key = self._key(name)
        if not put_if_absent(self._client, key, name, data) and self.read(name) != data:
            raise FileConflict(f"{name} exists with other contents; left untouched")
        return StoredFile(PurePosixPath(key), True, None, data)


def put_if_absent(client: _Client, key: str, what: str, data: bytes) -> bool:
    """One conditional, checksummed PUT (retried), known stored before it returns: True when
    this call created the key, False when the first attempt found it there (412). A 412 after
    an attempt whose answer was lost counts as created (that attempt's object is ours).

    A created object is known stored (issue 24 item 2) when the PUT's answer carries our
    SHA-256 checksum back, else by one ``HeadObject`` (checksum mode on) that finds the key
    with our size (and our checksum, when the server gives one). A server that answered 200
    without storing (the HEAD finds nothing, or other bytes under our name: our own object,
    not confirmed) costs another PUT, within the same retry budget; past it,
    :class:`StorageUnavailable` (the runner stops, the lease expires, a claim tries again)."""
    deadline = time.monotonic() + client.retry_seconds
    attempt = 0
    while True:
        created, answered = _put(client, key, what, data)
        if not created:
            return False
        problem = None if answered == _checksum(data) else _stored_problem(client, key, data)
        if problem is None:
            return True
        log_action(
            log, "archive.storage.put_lost", logging.WARNING, target=what, found=problem,
            attempt=attempt + 1,
        )  # fmt: skip
        pause = backoff(attempt, rnd=random.random())
        if time.monotonic() + pause >= deadline:
            raise StorageUnavailable(
                f"{what}: the object store answered PutObject but did not store it "
                f"({problem}) for {client.retry_seconds:g} s"
            )
        if problem != "missing":  # our object, unconfirmed, with other bytes: put it again
            client.call(
                "DeleteObject", what, lambda c: c.delete_object(Bucket=client.loc.bucket, Key=key)
            )  # fmt: skip
        time.sleep(pause)
        attempt += 1


def _put(client: _Client, key: str, what: str, data: bytes) -> tuple[bool, str]:
    """The conditional PUT: (created, the checksum the answer carries or "")."""
    loc = client.loc
    checksum = _checksum(data)
    extra = _put_args(loc)
    tries = 0

    failpoints.hit("objects.before_put")

    def put(c: Any) -> str:
        nonlocal tries
        tries += 1
        response = c.put_object(
            Bucket=loc.bucket, Key=key, Body=data, IfNoneMatch="*", ChecksumSHA256=checksum,
            ChecksumAlgorithm="SHA256", **extra,
        )  # fmt: skip
        return str(response.get("ChecksumSHA256") or "")

    try:
        return True, client.call("PutObject", what, put)
    except _Exists:
        return tries > 1, ""


def _stored_problem(client: _Client, key: str, data: bytes) -> str | None:
    """What one HEAD says is wrong with the object under ``key`` (None: our bytes are there):
    ``missing``, ``size`` or ``checksum``."""

    def head(c: Any) -> dict[str, Any]:
        return dict(c.head_object(Bucket=client.loc.bucket, Key=key, ChecksumMode="ENABLED"))

    try:
        answer = client.call("HeadObject", key, head)
    except FileNotFoundError:
        return "missing"
    if int(answer.get("ContentLength", -1)) != len(data):
        return "size"
    checksum = answer.get("ChecksumSHA256")
    if checksum and checksum != _checksum(data):
        return "checksum"
    return None


class S3Storage:
    """An S3 bucket prefix as an archive storage (the :class:`~storage.Storage` seam)."""

    def __init__(self, loc: S3Location, *, retry_seconds: float = 20.0) -> None:
        self.location = loc
        self._client = _Client(loc, retry_seconds)

    @property
    def where(self) -> str:
        return self.location.url

    def _identity_key(self) -> str:
        return self.location.key(IDENTITY_FILE)

    def identity(self) -> VolumeIdentity:
        key = self._identity_key()
        failpoints.hit("objects.identity")  # tests: a slow S3 endpoint
        try:
            data = self._client.call(
                "GetObject", self.where,
                lambda c: _read_body(c, self.location.bucket, key),
            )  # fmt: skip
        except FileNotFoundError:
            raise InvalidInput(
                f"{self.where} is not an archive storage (no {IDENTITY_FILE})"
            ) from None
        return parse_identity(data, f"{self.where}/{IDENTITY_FILE}", self._root())

    def identity_stamp(self) -> Hashable:
        key = self._identity_key()

        # GET, not HEAD: a HEAD's 404 does not tell a missing key from a missing bucket
        def stamp(c: Any) -> tuple[str, str, bytes]:
            response = c.get_object(Bucket=self.location.bucket, Key=key)
            body = response["Body"]
            try:
                data = bytes(body.read())
            finally:
                body.close()
            return (str(response.get("ETag")), str(response.get("LastModified")), data)

        return self._client.call("GetObject", self.where, stamp)

    def create_identity(self, storage_id: bytes, label: str) -> VolumeIdentity:
        data = identity_document(storage_id, label)
        if not put_if_absent(self._client, self._identity_key(), self.where, data):
            current = self.identity()
            if current.storage_id != storage_id:
                raise ConflictError(
                    f"{self.where} already holds storage {current.storage_id.hex()}; "
                    "refusing to overwrite"
                )
            return current
        return VolumeIdentity(self._root(), storage_id, label)

    def _root(self) -> PurePosixPath:
        """An identity's ``path``: ``/BUCKET/PREFIX`` (``where`` is the s3:// URL)."""
        return PurePosixPath("/", self.location.bucket, self.location.prefix)

    def has_identity(self, prefix: str) -> bool:
        """Is there an identity object under ``prefix`` of this bucket (nesting check)?"""
        key = f"{prefix}/{IDENTITY_FILE}" if prefix else IDENTITY_FILE
        try:
            self._client.call(
                "HeadObject", self.location.url_of(key),
                lambda c: c.head_object(Bucket=self.location.bucket, Key=key),
            )  # fmt: skip
        except FileNotFoundError:
            return False
        return True

    def identity_below(self, *, limit: int = NEST_SCAN_LIMIT) -> str | None:
        """The first prefix strictly below this storage's that holds an identity object,
        breadth first (``ListObjectsV2`` with the delimiter ``/``, level by level), or None;
        more than ``limit`` prefixes: :class:`NestScanTooLarge`. Like ``identity_below`` of a
        folder, before a new identity is written here (nesting, issue 27)."""
        loc = self.location
        queue = [_listing_prefix(loc)]  # "PREFIX/" or the bucket's root
        seen = 0
        while queue:
            level = queue.pop(0)
            keys, subs = self._level(level)
            if level != _listing_prefix(loc) and level + IDENTITY_FILE in keys:
                return level.rstrip("/")
            for sub in subs:
                seen += 1
                if seen > limit:
                    raise NestScanTooLarge(
                        f"{self.where} holds more than {limit} prefixes; a new archive storage "
                        "must not contain another and is checked prefix by prefix: choose an "
                        "empty prefix"
                    )
                queue.append(sub)
        return None

    def _level(self, level: str) -> tuple[set[str], list[str]]:
        """The keys and the sub-prefixes (each ending in ``/``) directly under ``level``."""
        args: dict[str, Any] = {"Bucket": self.location.bucket, "Prefix": level, "Delimiter": "/"}
        keys: set[str] = set()
        subs: list[str] = []
        what = self.location.url_of(level.rstrip("/")) if level else self.where

        def page(client: Any) -> dict[str, Any]:
            return dict(client.list_objects_v2(**args))

        while True:
            resp = self._client.call("ListObjectsV2", what, page)
            keys.update(o["Key"] for o in resp.get("Contents", []))
            subs += [p["Prefix"] for p in resp.get("CommonPrefixes", [])]
            token = resp.get("NextContinuationToken")
            if not resp.get("IsTruncated") or not token:
                return keys, sorted(subs)
            args["ContinuationToken"] = token

    def job(self, namespace_id: bytes, job_id: bytes) -> S3Job:
        return S3Job(self._client, self.location.job_prefix(namespace_id, job_id))

    def named_files(self, relative: str) -> S3NamedFiles:
        """The files under ``PREFIX/<relative>/`` (issue 28: ``<ns_hex>/<job_hex>.index``)."""
        return S3NamedFiles(self._client, self.location.key(relative.strip("/") + "/"))


def _listing_prefix(loc: S3Location) -> str:
    """The listing prefix of a location itself: ``PREFIX/``, or "" for the bucket's root."""
    return loc.key("") if loc.prefix else ""


def checksum_matches(expected_b64: str, data: bytes) -> bool:
    """Does a base64 ``x-amz-checksum-sha256`` value name these bytes (tests, docs)?"""
    try:
        return base64.b64decode(expected_b64) == bytes.fromhex(sha256_hex(data))
    except (binascii.Error, ValueError):
        return False
