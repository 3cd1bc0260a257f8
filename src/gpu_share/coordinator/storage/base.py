"""The interface every artifact store implements.

Methods block (disk or network I/O); services call them from a worker thread. An
upload is written to a temporary object first and becomes visible under its key
only on `commit`, so a failed upload leaves nothing behind.
"""

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import BinaryIO, Protocol


class UploadSink(Protocol):
    def write(self, data: bytes) -> None: ...

    def read_back(self) -> BinaryIO:
        """What was written so far, readable and seekable, before it is committed: an
        upload is checked against its kind from here (a remote store spools to a local
        file for this). Nothing may be written after it. The caller closes it."""

    def abort(self) -> None:
        """Discard what was written; safe to call more than once, and after a commit."""


class ArtifactStore(Protocol):
    presigns: bool
    """Whether `download_url` makes links: then agents fetch the bytes from the store
    itself, never through the coordinator."""

    def begin_upload(self) -> UploadSink: ...

    def commit(self, sink: UploadSink, key: str) -> None:
        """Publish the sink's bytes under `key`."""

    def read(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """The bytes under `key`; FileNotFoundError when there are none."""

    def local_path(self, key: str) -> Path | None:
        """A file path for `key` when the store is on this machine (lets responses use sendfile)."""

    def download_url(self, key: str, expires_in: timedelta) -> str | None:
        """A link that lets whoever holds it GET the bytes under `key` until it expires,
        with no other credential; None when the store cannot make one."""

    def delete(self, key: str) -> None:
        """Remove `key`; a missing key is not an error."""

    def exists(self, key: str) -> bool: ...

    def keys(self) -> Iterator[str]:
        """Every published key, in no particular order."""

    def sweep_temporary(self, max_age_sec: float) -> int:
        """Remove uploads abandoned by a crashed process; returns how many.

        Ages are measured by the storage's own timestamps (file mtimes, object dates),
        so this compares against the wall clock rather than the injected one.
        """
