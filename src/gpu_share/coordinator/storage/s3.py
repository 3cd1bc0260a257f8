"""Artifacts in an S3-compatible bucket (AWS S3, MinIO, R2, Ceph…), through obstore.

Objects live at `objects/<key>`; an upload streams to `tmp/upload-<random>` as a
multipart upload (at most `PART_BYTES × (PARTS_IN_FLIGHT + 1)` held in memory, whatever
its size), with a copy in a local temporary file that it is read back from to be checked,
and `commit` copies it to its key inside the bucket. A failed upload aborts
its multipart upload; one a crashed process left is removed by `sweep_temporary` once
complete, and by the bucket's `AbortIncompleteMultipartUpload` lifecycle rule while
still in parts (docs/operations.md).

Credentials come the AWS way, from the environment: `AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN`, or the instance's, task's or pod's
role (IMDS, ECS, web identity). Links for agents are signed against
`public_endpoint_url`, the address agents reach the store at.
"""

import contextlib
import secrets
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import obstore
from obstore.store import S3Store

from gpu_share.coordinator.storage.base import UploadSink

if TYPE_CHECKING:
    from obstore import WritableFile

OBJECTS = "objects/"
TEMPORARY = "tmp/"
PART_BYTES = 8 * 1024 * 1024  # S3's smallest part is 5 MiB
PARTS_IN_FLIGHT = 2


class StorageUnavailable(RuntimeError):
    """The bucket cannot be used: missing, unreachable, or refused to these credentials."""


class _Abandoned(Exception):
    """Raised into obstore's writer so that it aborts its multipart upload."""


class _S3Sink:
    """Streams to the temporary object and keeps a local copy, so that an upload is read
    back (checked against its kind) from this machine's disk, not downloaded again."""

    def __init__(self, store: S3Store, path: str) -> None:
        self._store = store
        self.path = path
        self._writer: WritableFile | None = obstore.open_writer(
            store, path, buffer_size=PART_BYTES, max_concurrency=PARTS_IN_FLIGHT
        )
        self._copy = tempfile.NamedTemporaryFile(prefix="gpushare-upload-")  # noqa: SIM115 (closed by finish or abort)

    def write(self, data: bytes) -> None:
        assert self._writer is not None, "write after read back, commit or abort"
        self._copy.write(data)
        self._writer.write(data)

    def finish(self) -> None:
        """Complete the temporary object (idempotent)."""
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.close()

    def read_back(self) -> BinaryIO:
        self._copy.flush()
        return open(self._copy.name, "rb")

    def drop_copy(self) -> None:
        self._copy.close()  # a named temporary file: closing deletes it

    def abort(self) -> None:
        self.drop_copy()
        if self._writer is not None:
            writer, self._writer = self._writer, None
            with contextlib.suppress(Exception):  # the upload may have failed already
                writer.__exit__(_Abandoned, _Abandoned(), None)
        obstore.delete(self._store, self.path)  # a completed temporary object; else a no-op


class S3ArtifactStore:
    presigns = True

    def __init__(self, store: S3Store, signing_store: S3Store | None = None) -> None:
        """`signing_store`: the same bucket as agents reach it, when that address differs
        from the coordinator's (a signature covers the host)."""
        self._store = store
        self._signing_store = signing_store or store

    @classmethod
    def open(
        cls,
        bucket: str,
        *,
        endpoint_url: str = "",
        public_endpoint_url: str = "",
        region: str = "",
    ) -> "S3ArtifactStore":
        def connect(endpoint: str) -> S3Store:
            options: dict[str, object] = {}
            if endpoint:
                options["endpoint"] = endpoint
            if region:
                options["region"] = region
            return S3Store(
                bucket,
                client_options={"allow_http": endpoint.startswith("http://")},
                **options,  # type: ignore[arg-type] # keys of obstore's S3Config
            )

        store = connect(endpoint_url)
        public = public_endpoint_url.rstrip("/")
        signing = connect(public) if public and public != endpoint_url.rstrip("/") else None
        return cls(store, signing)

    def check(self) -> None:
        """Raise, saying why, unless the bucket answers to these credentials."""
        try:
            next(iter(obstore.list(self._store, TEMPORARY, chunk_size=1)), None)
        except Exception as exc:
            config = self._store.config
            where = config.get("endpoint") or "AWS"
            raise StorageUnavailable(
                f"the artifact bucket {config.get('bucket')!r} at {where} cannot be listed "
                f"with these credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY or the "
                f"machine's role): {exc}"
            ) from exc

    def _object(self, key: str) -> str:
        if not key or "/" in key or key.startswith("."):
            raise ValueError(f"bad storage key {key!r}")
        return OBJECTS + key

    def begin_upload(self) -> _S3Sink:
        return _S3Sink(self._store, f"{TEMPORARY}upload-{secrets.token_hex(8)}")

    def commit(self, sink: UploadSink, key: str) -> None:
        assert isinstance(sink, _S3Sink)
        sink.finish()
        sink.drop_copy()
        obstore.copy(self._store, sink.path, self._object(key))
        obstore.delete(self._store, sink.path)

    def read(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        got = obstore.get(self._store, self._object(key))
        for chunk in got.stream(min_chunk_size=chunk_size):
            yield bytes(chunk)

    def local_path(self, key: str) -> Path | None:
        return None

    def download_url(self, key: str, expires_in: timedelta) -> str | None:
        return obstore.sign(self._signing_store, "GET", self._object(key), expires_in)

    def delete(self, key: str) -> None:
        obstore.delete(self._store, self._object(key))

    def exists(self, key: str) -> bool:
        try:
            obstore.head(self._store, self._object(key))
        except FileNotFoundError:
            return False
        return True

    def keys(self) -> Iterator[str]:
        """Every published key, in no particular order."""
        for batch in obstore.list(self._store, OBJECTS):
            for meta in batch:
                yield meta["path"].removeprefix(OBJECTS)

    def sweep_temporary(self, max_age_sec: float) -> int:
        removed = 0
        cutoff = time.time() - max_age_sec
        for batch in obstore.list(self._store, TEMPORARY):
            for meta in batch:
                if meta["last_modified"].timestamp() < cutoff:
                    obstore.delete(self._store, meta["path"])
                    removed += 1
        return removed
