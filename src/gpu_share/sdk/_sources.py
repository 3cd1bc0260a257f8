"""What an upload reads from: a path, bytes or a binary file, never all in memory.

The file is read twice, once to hash it (the server verifies the SHA-256 and the SDK
looks up an identical live artifact by it) and once per upload attempt, in 1 MiB
pieces; so memory stays flat whatever the size, and a retried upload starts again
from the first byte. A file object that cannot seek is spooled to a temporary file
on disk while it is hashed.
"""

import asyncio
import hashlib
import os
import tempfile
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from gpu_share.sdk.errors import ConfigurationError

CHUNK = 1 << 20

FileSource = str | os.PathLike[str] | bytes | bytearray | memoryview | IO[bytes]


@dataclass
class UploadSource:
    name: str
    size: int
    sha256: str
    _read_from_start: Callable[[], Iterator[bytes]]
    on_progress: Callable[[int], None] | None = field(default=None, repr=False)
    _cleanup: Callable[[], None] | None = field(default=None, repr=False)

    def chunks(self) -> Generator[bytes, None, None]:
        sent = 0
        for chunk in self._read_from_start():
            sent += len(chunk)
            if self.on_progress is not None:
                self.on_progress(sent)
            yield chunk

    async def achunks(self) -> AsyncIterator[bytes]:
        """The same pieces, each read in a worker thread so the event loop keeps running."""
        pieces = self.chunks()
        done = object()
        try:
            while (chunk := await asyncio.to_thread(next, pieces, done)) is not done:
                assert isinstance(chunk, bytes)
                yield chunk
        finally:
            pieces.close()  # an upload cut short still closes its file

    def close(self) -> None:
        if self._cleanup is not None:
            self._cleanup()
            self._cleanup = None


def is_url(value: object) -> bool:
    return isinstance(value, str) and value.startswith(("http://", "https://"))


def prepare(source: FileSource, name: str | None = None) -> UploadSource:
    """Hash `source` (blocking: run it off the event loop) and say how to read it again."""
    if isinstance(source, bytes | bytearray | memoryview):
        data = bytes(source)
        return UploadSource(
            name=name or f"{len(data)} bytes",
            size=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            _read_from_start=lambda: _slices(data),
        )
    if isinstance(source, str | os.PathLike):
        return _from_path(Path(source), name)
    if hasattr(source, "read"):
        return _from_file(source, name)
    raise ConfigurationError(
        f"cannot upload a {type(source).__name__}: give a path, bytes or a binary file"
    )


def _slices(data: bytes) -> Iterator[bytes]:
    view = memoryview(data)
    for start in range(0, len(data), CHUNK):
        yield bytes(view[start : start + CHUNK])


def _read_file(file: IO[bytes]) -> Iterator[bytes]:
    while chunk := file.read(CHUNK):
        if not isinstance(chunk, bytes):
            raise ConfigurationError("the file must be opened in binary mode ('rb')")
        yield chunk


def _from_path(path: Path, name: str | None) -> UploadSource:
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    hasher = hashlib.sha256()
    size = 0
    with path.open("rb") as file:
        for chunk in _read_file(file):
            hasher.update(chunk)
            size += len(chunk)

    def read() -> Iterator[bytes]:
        with path.open("rb") as file:
            yield from _read_file(file)

    return UploadSource(name or path.name, size, hasher.hexdigest(), read)


def _from_file(file: IO[bytes], name: str | None) -> UploadSource:
    label = name or str(getattr(file, "name", "file"))
    if not _seekable(file):
        return _spooled(file, label)
    start = file.tell()
    hasher = hashlib.sha256()
    size = 0
    for chunk in _read_file(file):
        hasher.update(chunk)
        size += len(chunk)

    def read() -> Iterator[bytes]:
        file.seek(start)
        yield from _read_file(file)

    return UploadSource(Path(label).name, size, hasher.hexdigest(), read)


def _seekable(file: Any) -> bool:
    try:
        return bool(file.seekable())
    except (AttributeError, OSError, ValueError):
        return False


def _spooled(file: IO[bytes], label: str) -> UploadSource:
    handle, raw = tempfile.mkstemp(prefix="gpu-share-upload-")
    path = Path(raw)
    hasher = hashlib.sha256()
    size = 0
    try:
        with os.fdopen(handle, "wb") as spool:
            for chunk in _read_file(file):
                hasher.update(chunk)
                spool.write(chunk)
                size += len(chunk)
    except BaseException:
        path.unlink(missing_ok=True)
        raise

    def read() -> Iterator[bytes]:
        with path.open("rb") as spooled:
            yield from _read_file(spooled)

    return UploadSource(
        Path(label).name, size, hasher.hexdigest(), read, _cleanup=lambda: _unlink(path)
    )


def _unlink(path: Path) -> None:
    path.unlink(missing_ok=True)
