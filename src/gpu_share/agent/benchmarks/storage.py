"""Storage throughput in the agent's data folder, where jobs' downloads and files live.

The write is timed through `fsync`, so it measures the disk, not the page cache. The
file's pages are then dropped from the cache (`POSIX_FADV_DONTNEED`, which drops clean
pages: they are clean once synced) before it is read back, so the read comes from the
disk too. The file is random bytes, which no compressing or deduplicating file system
can shrink, and it is removed afterwards whatever happens.
"""

import os
import secrets
import time
from pathlib import Path

from gpu_share.protocol.benchmarks import StorageMeasurement

MiB = 1024 * 1024
STORAGE_BYTES = 64 * MiB
CHUNK = 1 * MiB


class PageCacheNotDropped(Exception):
    """This system cannot drop a file from the page cache (no posix_fadvise)."""


def _drop_from_cache(fd: int) -> None:
    if not hasattr(os, "posix_fadvise"):
        raise PageCacheNotDropped("posix_fadvise is not available here")
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def measure_storage(directory: Path, size: int = STORAGE_BYTES) -> StorageMeasurement:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"storage-{secrets.token_hex(6)}.bin"
    chunk = os.urandom(CHUNK)
    chunks = max(1, size // CHUNK)
    written = chunks * CHUNK
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            started = time.perf_counter()
            for _ in range(chunks):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
            os.fsync(fd)
            write_sec = time.perf_counter() - started
            _drop_from_cache(fd)
        finally:
            os.close(fd)
        fd = os.open(path, os.O_RDONLY)
        try:
            _drop_from_cache(fd)
            started = time.perf_counter()
            read = 0
            while block := os.read(fd, CHUNK):
                read += len(block)
            read_sec = time.perf_counter() - started
        finally:
            os.close(fd)
    finally:
        path.unlink(missing_ok=True)
    return StorageMeasurement(
        write_mbps=written / max(write_sec, 1e-9) / 1e6,
        read_mbps=read / max(read_sec, 1e-9) / 1e6,
    )
