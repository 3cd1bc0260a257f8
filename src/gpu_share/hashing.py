"""SHA-256 of files, read in pieces: the one way the SDK, the agent and the coordinator hash."""

import hashlib
from collections.abc import Iterable
from pathlib import Path

CHUNK_BYTES = 1 << 20


def sha256_file(path: Path) -> str:
    return sha256_chunks(_read(path))[0]


def sha256_chunks(chunks: Iterable[bytes]) -> tuple[str, int]:
    """The hex digest and total size of a stream of bytes."""
    hasher = hashlib.sha256()
    size = 0
    for chunk in chunks:
        hasher.update(chunk)
        size += len(chunk)
    return hasher.hexdigest(), size


def _read(path: Path) -> Iterable[bytes]:
    with path.open("rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            yield chunk
