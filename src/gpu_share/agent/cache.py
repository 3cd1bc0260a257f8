"""A content-addressed cache of job inputs, shared by all jobs on this node.

Objects are stored under their SHA-256 and made read-only; jobs only ever see them
through read-only binds or copies.

Knowing a hash never grants the content: the node serves jobs of many tenants, and a
tenant could name another's checksum to be handed bytes it was never given. So an
object leaves the cache only on one of two warrants:

- `get_vouched`: the coordinator vouches for the checksum. It names a platform
  artifact the job's tenant owns (or the lease's own checkpoint), with the artifact's
  real SHA-256, so whatever is stored under that hash is what the job is entitled to.
- `get_revalidated`: the origin confirms. An external URL is always asked again;
  with the validators (ETag, Last-Modified) stored when that same URL was last
  downloaded, its 304 means "still what you got from me", and only then is the
  object stored for that URL served. A checksum the tenant supplies is verified
  against what comes back, never used to find something.
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


class _ConfirmedObjectGone(Exception):
    """The origin answered 304, but the object it confirmed was evicted meanwhile."""


class ArtifactCache:
    """Objects by SHA-256, and per URL the validators of its last download.

    Every file returned is pinned (kept through eviction) until `unpin(sha256)`.
    """

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

    def _lookup(self, sha256: str) -> Path | None:
        path = self._object(sha256)
        if path.is_file():
            with contextlib.suppress(OSError):
                os.utime(path)  # recently used: evicted last
            return path
        return None

    def _hit(self, sha256: str) -> CachedFile | None:
        path = self._lookup(sha256)
        if path is None:
            return None
        self.pin(sha256)
        return CachedFile(path, sha256, path.stat().st_size, downloaded=False)

    async def get_vouched(self, sha256: str, download: Downloader) -> CachedFile:
        """The object `sha256`, downloaded when missing.

        Only for a checksum the coordinator vouches for (a platform artifact's own): the
        hash alone decides what is served.
        """
        async with self._locks.setdefault(f"sha256:{sha256}", asyncio.Lock()):
            if (hit := self._hit(sha256)) is not None:
                return hit
            return await self._store(download, {})

    async def get_revalidated(self, url: str, download: Downloader) -> CachedFile:
        """The content at `url` now, as the origin says: stored bytes only on its 304."""
        async with self._locks.setdefault(f"url:{url}", asyncio.Lock()):
            known = self._index.get(url)
            validators: dict[str, str] = {}
            if known and self._lookup(known["sha256"]) is not None:
                if known.get("etag"):
                    validators["If-None-Match"] = known["etag"]
                if known.get("last_modified"):
                    validators["If-Modified-Since"] = known["last_modified"]
            try:
                return await self._store(download, validators, url=url)
            except _ConfirmedObjectGone:
                return await self._store(download, {}, url=url)

    async def _store(
        self, download: Downloader, validators: dict[str, str], *, url: str | None = None
    ) -> CachedFile:
        tmp = self._tmp / f"dl-{secrets.token_hex(8)}"
        try:
            fetched = await download(tmp, validators)
            if fetched.not_modified:  # only ever an answer to `validators`, for `url`
                known = self._index.get(url) if url is not None and validators else None
                hit = self._hit(known["sha256"]) if known else None
                if hit is None:
                    raise _ConfirmedObjectGone
                return hit
            target = self._object(fetched.sha256)
            if not target.exists():
                tmp.chmod(0o444)
                tmp.replace(target)
            self.pin(fetched.sha256)
        finally:
            tmp.unlink(missing_ok=True)
        if url is not None:
            self._remember(url, fetched)
        if await asyncio.to_thread(self.evict):
            self._forget_evicted()
        return CachedFile(target, fetched.sha256, fetched.size, downloaded=True)

    def _remember(self, url: str, fetched: Fetched) -> None:
        if fetched.etag or fetched.last_modified:
            self._index[url] = {
                "sha256": fetched.sha256,
                "etag": fetched.etag or "",
                "last_modified": fetched.last_modified or "",
            }
        elif self._index.pop(url, None) is None:
            return
        self._save_index()

    def _forget_evicted(self) -> None:
        """Drop the validators of URLs whose object is gone: nothing to revalidate."""
        gone = [
            url for url, known in self._index.items() if not self._object(known["sha256"]).is_file()
        ]
        for url in gone:
            del self._index[url]
        if gone:
            self._save_index()

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
