"""Artifacts in a local directory: `objects/ab/<key>` plus `tmp/` for uploads in flight."""

import contextlib
import os
import secrets
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import BinaryIO

from gpu_share.coordinator.storage.base import UploadSink


class _FileSink:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: BinaryIO | None = path.open("xb")

    def write(self, data: bytes) -> None:
        assert self._file is not None, "write after commit or abort"
        self._file.write(data)

    def read_back(self) -> BinaryIO:
        assert self._file is not None, "read back after commit or abort"
        self._file.flush()
        return self.path.open("rb")

    def close(self) -> None:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None

    def abort(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self.path.unlink(missing_ok=True)


class LocalArtifactStore:
    presigns = False  # downloads go through the coordinator, which checks who asks

    def __init__(self, root: Path) -> None:
        self.root = root
        self._objects = root / "objects"
        self._tmp = root / "tmp"
        self._objects.mkdir(parents=True, exist_ok=True)
        self._tmp.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        if not key or "/" in key or key.startswith("."):
            raise ValueError(f"bad storage key {key!r}")
        return self._objects / key[:2] / key

    def begin_upload(self) -> _FileSink:
        return _FileSink(self._tmp / f"upload-{secrets.token_hex(8)}")

    def commit(self, sink: UploadSink, key: str) -> None:
        assert isinstance(sink, _FileSink)
        sink.close()
        target = self._path(key)
        target.parent.mkdir(exist_ok=True)
        os.replace(sink.path, target)

    def read(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        with self._path(key).open("rb") as f:
            while chunk := f.read(chunk_size):
                yield chunk

    def local_path(self, key: str) -> Path | None:
        return self._path(key)

    def download_url(self, key: str, expires_in: timedelta) -> str | None:
        return None

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def keys(self) -> Iterator[str]:
        for path in self._objects.glob("*/*"):
            yield path.name

    def sweep_temporary(self, max_age_sec: float) -> int:
        removed = 0
        cutoff = time.time() - max_age_sec
        for path in self._tmp.iterdir():
            with contextlib.suppress(FileNotFoundError):
                if path.stat().st_mtime < cutoff:
                    path.unlink()
                    removed += 1
        return removed
