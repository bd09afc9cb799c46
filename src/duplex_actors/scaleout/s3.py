"""``s3://bucket/prefix`` locations and the boto3 client, for ``--log-upload`` and ``duplex-replay``.

Credentials come from the standard AWS chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``,
``AWS_PROFILE``, an instance role, ...); the region from ``AWS_REGION``/``AWS_DEFAULT_REGION``
(``us-east-1`` when neither is set). ``endpoint_url`` (``--s3-endpoint-url``, or boto3's own
``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``) points at an S3-compatible store (SeaweedFS, MinIO,
Ceph RGW, R2, ...), which then gets path-style addressing. boto3 is imported only here, lazily.
"""

from __future__ import annotations

import os
from typing import Any

import attrs

LOG_SUFFIX = ".dlog"


class BadS3Url(ValueError):
    pass


@attrs.frozen(slots=True)
class S3Location:
    bucket: str
    prefix: str = ""  # no leading or trailing "/"

    def key_for(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def url(self, key: str | None = None) -> str:
        return f"s3://{self.bucket}/{self.prefix if key is None else key}"


def is_s3_url(text: str) -> bool:
    return str(text).startswith("s3://")


def parse_s3_url(url: str, *, keep_trailing_slash: bool = False) -> S3Location:
    """``s3://bucket`` or ``s3://bucket/some/prefix`` (a trailing ``/`` is dropped unless
    ``keep_trailing_slash``: ``duplex-replay`` uses it to tell "this folder" from "this prefix")."""
    if not is_s3_url(url):
        raise BadS3Url(f"{url!r} is not an s3://bucket/prefix URL")
    bucket, _, prefix = url[len("s3://") :].partition("/")
    if not bucket or any(c in bucket for c in " ?#"):
        raise BadS3Url(f"{url!r}: no valid bucket name")
    prefix = prefix.lstrip("/")
    if not keep_trailing_slash:
        prefix = prefix.rstrip("/")
    return S3Location(bucket, prefix)


def _env_endpoint() -> str | None:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def make_client(endpoint_url: str | None = None, *, max_attempts: int = 3) -> Any:
    """A boto3 S3 client with short timeouts (the uploader retries on top of boto3's retries)."""
    import boto3
    from botocore.config import Config

    custom = endpoint_url or _env_endpoint()
    config = Config(
        connect_timeout=5,
        read_timeout=30,
        retries={"max_attempts": max_attempts, "mode": "standard"},
        s3={"addressing_style": "path"} if custom else None,
    )
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint_url or None, region_name=region, config=config
    )


def error_status(exc: BaseException) -> tuple[str, int]:
    """(error code, HTTP status) of a botocore ``ClientError``; ("", 0) for anything else."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return "", 0
    code = str(response.get("Error", {}).get("Code", ""))
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return code, status


def list_log_keys(client: Any, location: S3Location) -> list[str]:
    """The session logs at ``location``: the one object if the prefix names a ``.dlog`` key,
    else every ``.dlog`` key under the prefix (``a/b`` lists ``a/b...``; ``a/b/`` lists the
    folder), sorted."""
    prefix = location.prefix
    if prefix.endswith(LOG_SUFFIX):
        try:
            client.head_object(Bucket=location.bucket, Key=prefix)
            return [prefix]
        except Exception as exc:
            _, status = error_status(exc)
            if status != 404:
                raise
    keys: list[str] = []
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=location.bucket, Prefix=prefix):
        for item in page.get("Contents", []) or []:
            key = str(item["Key"])
            if key.endswith(LOG_SUFFIX):
                keys.append(key)
    return sorted(keys)


def get_bytes(client: Any, bucket: str, key: str) -> bytes:
    response = client.get_object(Bucket=bucket, Key=key)
    body = response["Body"]
    try:
        return bytes(body.read())
    finally:
        body.close()
