"""``s3://bucket/prefix`` through boto3: AWS S3 and any S3-compatible service (MinIO, Ceph, moto).

Credentials, region and endpoint come from boto3's standard chain: environment (AWS_ACCESS_KEY_ID, AWS_PROFILE,
AWS_ENDPOINT_URL, ...), ~/.aws/config and credentials, SSO, container and instance roles. ``--endpoint-url`` overrides
the endpoint. Large files move in parallel parts through s3transfer (multipart uploads, ranged downloads).
Messages name the bucket and prefix only; credentials never appear in them.
"""

from __future__ import annotations

import email.utils
import time
from functools import cached_property
from urllib.parse import urlsplit, urlunsplit

from neuronpack.artifacts.remote.transport import ByteCallback, ObjectInfo
from neuronpack.errors import RemoteError

# 16 MiB parts, 4 parts in flight per file (and several files at once, see push.py / pull.py).
PART_SIZE = 16 * 1024 * 1024
PART_CONCURRENCY = 4
_MISSING = ("404", "NoSuchKey", "NotFound")
_PRECONDITION = ("412", "PreconditionFailed", "409", "ConditionalRequestConflict")


def transfer_config():
    """The s3transfer settings every file transfer uses (the benchmark's plain copy uses the same)."""
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(multipart_threshold=PART_SIZE, multipart_chunksize=PART_SIZE,
                          max_concurrency=PART_CONCURRENCY, use_threads=True)


def make_client(endpoint_url: str | None = None):
    """A boto3 S3 client from the standard configuration chain (pool sized for parallel parts and files)."""
    import boto3
    from botocore.config import Config

    config = Config(retries={"max_attempts": 3, "mode": "standard"}, max_pool_connections=32,
                    connect_timeout=10, read_timeout=60)
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url or None, config=config)


class S3Transport:
    def __init__(self, url: str, *, endpoint_url: str | None = None) -> None:
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        if not bucket:
            raise RemoteError("an s3:// URL needs a bucket", where=url, fix="use s3://bucket/prefix")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}".rstrip("/")
        self._endpoint_url = endpoint_url

    @cached_property
    def client(self):
        return make_client(self._endpoint_url)

    @cached_property
    def _config(self):
        return transfer_config()

    def _key(self, path: str) -> str:
        return f"{self.prefix}/{path}" if self.prefix else path

    def _rel(self, key: str) -> str:
        return key[len(self.prefix) + 1:] if self.prefix else key

    def read(self, path: str) -> bytes | None:
        with self._errors(path):
            try:
                return self.client.get_object(Bucket=self.bucket, Key=self._key(path))["Body"].read()
            except self._client_error() as exc:
                if _code(exc) in _MISSING:
                    return None
                raise

    def stat(self, path: str) -> ObjectInfo | None:
        with self._errors(path):
            try:
                head = self.client.head_object(Bucket=self.bucket, Key=self._key(path))
            except self._client_error() as exc:
                if _code(exc) in _MISSING:
                    return None
                raise
        return ObjectInfo(path, head["ContentLength"], head["LastModified"].timestamp(), head["ETag"])

    def now(self) -> float:
        with self._errors(""):
            response = self.client.head_bucket(Bucket=self.bucket)
        date = response["ResponseMetadata"]["HTTPHeaders"].get("date")
        return email.utils.parsedate_to_datetime(date).timestamp() if date else time.time()

    def write(self, path: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None) -> str | None:
        extra = {"IfNoneMatch": "*"} if if_absent else {"IfMatch": if_match} if if_match else {}
        with self._errors(path):
            try:
                return self.client.put_object(Bucket=self.bucket, Key=self._key(path), Body=data, **extra)["ETag"]
            except self._client_error() as exc:
                if extra and _code(exc) in _PRECONDITION:
                    return None
                raise

    def upload(self, path: str, local: str, *, sha256: str, on_bytes: ByteCallback) -> None:
        with self._errors(path):
            self.client.upload_file(local, self.bucket, self._key(path), ExtraArgs={"Metadata": {"sha256": sha256}},
                                    Callback=on_bytes, Config=self._config)

    def download(self, path: str, local: str, *, on_bytes: ByteCallback) -> None:
        with self._errors(path):
            self.client.download_file(self.bucket, self._key(path), local, Callback=on_bytes, Config=self._config)

    def list_dirs(self) -> list[str]:
        prefix = f"{self.prefix}/" if self.prefix else ""
        names = []
        with self._errors(""):
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix,
                                                                              Delimiter="/"):
                names += [p["Prefix"][len(prefix):].rstrip("/") for p in page.get("CommonPrefixes", [])]
        return names

    def list_files(self, directory: str) -> list[ObjectInfo]:
        rows = []
        with self._errors(directory):
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                              Prefix=self._key(directory) + "/"):
                rows += [ObjectInfo(self._rel(o["Key"]), o["Size"], o["LastModified"].timestamp(), o["ETag"])
                         for o in page.get("Contents", [])]
        return rows

    def delete(self, paths: list[str]) -> None:
        with self._errors(""):
            for start in range(0, len(paths), 1000):
                batch = [{"Key": self._key(p)} for p in paths[start:start + 1000]]
                self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})

    @staticmethod
    def _client_error():
        from botocore.exceptions import ClientError

        return ClientError

    def _errors(self, path: str):
        return _S3Errors(self, path)


class _S3Errors:
    """Turns botocore's exceptions into one RemoteError line naming the bucket/object (never the credentials)."""

    def __init__(self, transport: S3Transport, path: str) -> None:
        self.where = f"{transport.url}/{path}".rstrip("/")
        self.bucket_level = not path  # a 404 on a bucket-level request (HEAD has no error body) = no bucket
        self.endpoint = _without_userinfo(transport._endpoint_url)

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None or isinstance(exc, RemoteError):
            return False
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
        from s3transfer.exceptions import RetriesExceededError, S3DownloadFailedError, S3UploadFailedError

        if isinstance(exc, NoCredentialsError):
            raise RemoteError("no AWS credentials found", where=self.where,
                              fix="set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or use a role") from None
        if isinstance(exc, ClientError):
            code = _code(exc)
            if code == "NoSuchBucket" or code == "404" and self.bucket_level:
                raise RemoteError("the bucket does not exist", where=self.where,
                                  fix="create it or fix the s3:// URL") from None
            if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                raise RemoteError(f"access denied ({code})", where=self.where,
                                  fix="check the credentials (AWS_PROFILE, AWS_ACCESS_KEY_ID) and the bucket policy") \
                    from None
            raise RemoteError(f"the store refused the request ({code}: {exc.response['Error'].get('Message', '')})",
                              where=self.where, fix="check the URL, --endpoint-url and permissions") from None
        if isinstance(exc, BotoCoreError | S3DownloadFailedError | S3UploadFailedError | RetriesExceededError):
            endpoint = f" at {self.endpoint}" if self.endpoint else ""
            raise RemoteError(f"cannot reach the store{endpoint} ({type(exc).__name__})", where=self.where,
                              fix="check the network and --endpoint-url / AWS_ENDPOINT_URL, then retry") from None
        return False


def _without_userinfo(url: str | None) -> str | None:
    """An endpoint URL fit for a message: any user:password@ part removed."""
    if not url:
        return url
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _code(exc) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))
