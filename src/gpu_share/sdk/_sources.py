"""What an upload reads from: a path, bytes or a binary file, never all in memory.

The file is read twice, once to hash it (the server verifies the SHA-256 and the SDK
looks up an identical live artifact by it) and once per upload attempt, in 1 MiB
pieces; so memory stays flat whatever the size, and a retried upload starts again
from the first byte. A file object that cannot seek is spooled to a temporary file
on disk while it is hashed.
"""

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from gpu_share.hashing import CHUNK_BYTES, sha256_chunks
from gpu_share.sdk.errors import ConfigurationError

FileSource = str | os.PathLike[str] | bytes | bytearray | memoryview | IO[bytes]


@dataclass
class UploadSource:
    name: str
    size: int
    sha256: str
    _read_from_start: Callable[[], Iterator[bytes]]
    on_progress: Callable[[int], None] | None = field(default=None, repr=False)
    _cleanup: Callable[[], None] | None = field(default=None, repr=False)
    # The name the artifact is uploaded under (`?name=`): the one given, else a path's or
    # a named file's; None for bytes or an unnamed stream (`name` is then only a label).
    filename: str | None = None

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
        sha256, size = sha256_chunks([data])
        return UploadSource(
            name or f"{size} bytes", size, sha256, lambda: _slices(data), filename=name
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
    for start in range(0, len(data), CHUNK_BYTES):
        yield bytes(view[start : start + CHUNK_BYTES])


def _read_file(file: IO[bytes]) -> Iterator[bytes]:
    while chunk := file.read(CHUNK_BYTES):
        if not isinstance(chunk, bytes):
            raise ConfigurationError("the file must be opened in binary mode ('rb')")
        yield chunk


def _from_path(path: Path, name: str | None) -> UploadSource:
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")

    def read() -> Iterator[bytes]:
        with path.open("rb") as file:
            yield from _read_file(file)

    sha256, size = sha256_chunks(read())
    return UploadSource(name or path.name, size, sha256, read, filename=name or path.name)


def _file_name(file: IO[bytes]) -> str | None:
    """A file opened from a path knows it; stdin's `<stdin>` and a descriptor's number
    are no file names."""
    raw = getattr(file, "name", None)
    if not isinstance(raw, str) or not raw or raw.startswith("<"):
        return None
    return Path(raw).name or None


def _from_file(file: IO[bytes], name: str | None) -> UploadSource:
    filename = name or _file_name(file)
    label = filename or str(getattr(file, "name", "file"))
    if not _seekable(file):
        return _spooled(file, label, filename)
    start = file.tell()

    def read() -> Iterator[bytes]:
        file.seek(start)
        yield from _read_file(file)

    sha256, size = sha256_chunks(read())
    return UploadSource(Path(label).name, size, sha256, read, filename=filename)


def _seekable(file: Any) -> bool:
    try:
        return bool(file.seekable())
    except (AttributeError, OSError, ValueError):
        return False


def _spooled(file: IO[bytes], label: str, filename: str | None) -> UploadSource:
    handle, raw = tempfile.mkstemp(prefix="gpu-share-upload-")
    path = Path(raw)
    try:
        with os.fdopen(handle, "wb") as spool:
            sha256, size = sha256_chunks(_copied(_read_file(file), spool))
    except BaseException:
        path.unlink(missing_ok=True)
        raise

    def read() -> Iterator[bytes]:
        with path.open("rb") as spooled:
            yield from _read_file(spooled)

    return UploadSource(
        Path(label).name, size, sha256, read, _cleanup=lambda: _unlink(path), filename=filename
    )


def _copied(chunks: Iterator[bytes], spool: IO[bytes]) -> Iterator[bytes]:
    """The chunks, each written to `spool` on the way past."""
    for chunk in chunks:
        spool.write(chunk)
        yield chunk


def _unlink(path: Path) -> None:
    path.unlink(missing_ok=True)
