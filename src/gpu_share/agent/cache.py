"""A content-addressed cache of job inputs, shared by all jobs on this node.

Objects are stored under their SHA-256 and made read-only; jobs only ever see them
through read-only binds or copies. A URL whose checksum is not known up front is
remembered with its validators (ETag, Last-Modified) so a second fetch can be a
conditional request answered with 304.
"""

import asyncio
import contextlib
import json
import logging
import os
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CachedFile:
    path: Path
    sha256: str
    size: int
    downloaded: bool  # False: served from the cache


@dataclass(frozen=True)
class Fetched:
    """What a downloader reports about the temporary file it wrote."""

    sha256: str
    size: int
    etag: str | None = None
    last_modified: str | None = None
    not_modified: bool = False


# A downloader writes the URL's bytes to `dest` (or answers not_modified given validators).
Downloader = Callable[[Path, dict[str, str]], Awaitable[Fetched]]


class ArtifactCache:
    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self._objects = root / "objects"
        self._tmp = root / "tmp"
        self._index_path = root / "urls.json"
        self._objects.mkdir(parents=True, exist_ok=True)
        self._tmp.mkdir(parents=True, exist_ok=True)
        for stale in self._tmp.iterdir():
            stale.unlink(missing_ok=True)
        self._locks: dict[str, asyncio.Lock] = {}
        self._pinned: dict[str, int] = {}
        try:
            self._index: dict[str, dict[str, str]] = json.loads(self._index_path.read_text())
        except (FileNotFoundError, ValueError):
            self._index = {}

    def _object(self, sha256: str) -> Path:
        return self._objects / sha256

    def lookup(self, sha256: str) -> Path | None:
        path = self._object(sha256)
        if path.is_file():
            with contextlib.suppress(OSError):
                os.utime(path)  # recently used: evicted last
            return path
        return None

    async def get(self, url: str, sha256: str | None, download: Downloader) -> CachedFile:
        """The file for `url`: from the cache when its content is known to be here."""
        async with self._locks.setdefault(sha256 or url, asyncio.Lock()):
            if sha256 is not None and (hit := self.lookup(sha256)) is not None:
                return CachedFile(hit, sha256, hit.stat().st_size, downloaded=False)
            validators: dict[str, str] = {}
            known = self._index.get(url) if sha256 is None else None
            if known and self.lookup(known["sha256"]) is not None:
                if known.get("etag"):
                    validators["If-None-Match"] = known["etag"]
                if known.get("last_modified"):
                    validators["If-Modified-Since"] = known["last_modified"]
            tmp = self._tmp / f"dl-{secrets.token_hex(8)}"
            try:
                fetched = await download(tmp, validators)
                if fetched.not_modified and known:
                    hit = self.lookup(known["sha256"])
                    if hit is not None:
                        return CachedFile(hit, known["sha256"], hit.stat().st_size, False)
                target = self._object(fetched.sha256)
                if not target.exists():
                    tmp.chmod(0o444)
                    tmp.replace(target)
            finally:
                tmp.unlink(missing_ok=True)
            if fetched.etag or fetched.last_modified:
                self._index[url] = {
                    "sha256": fetched.sha256,
                    "etag": fetched.etag or "",
                    "last_modified": fetched.last_modified or "",
                }
                self._save_index()
            await asyncio.to_thread(self.evict)
            return CachedFile(target, fetched.sha256, fetched.size, downloaded=True)

    def pin(self, sha256: str) -> None:
        self._pinned[sha256] = self._pinned.get(sha256, 0) + 1

    def unpin(self, sha256: str) -> None:
        count = self._pinned.get(sha256, 0) - 1
        if count <= 0:
            self._pinned.pop(sha256, None)
        else:
            self._pinned[sha256] = count

    def _save_index(self) -> None:
        tmp = self._index_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._index))
        tmp.replace(self._index_path)

    def evict(self) -> int:
        """Delete least recently used objects (not pinned) until under `max_bytes`."""
        entries = []
        total = 0
        for path in self._objects.iterdir():
            with contextlib.suppress(FileNotFoundError):
                stat = path.stat()
                entries.append((stat.st_mtime, stat.st_size, path))
                total += stat.st_size
        removed = 0
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            if path.name in self._pinned:
                continue
            path.unlink(missing_ok=True)
            total -= size
            removed += 1
        if removed:
            log.info("cache: evicted %d objects", removed)
        return removed
