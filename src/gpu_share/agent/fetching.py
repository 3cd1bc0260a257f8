"""Getting a job's or session's input onto this node: the cache first, then the network.

Platform artifacts come from the coordinator through its signed URL, and their
checksum, which the coordinator vouches for, may be served from the cache. Anything
else goes through the SSRF-safe fetcher to its origin every time (conditionally, so
an unchanged file is not sent again): a checksum a tenant names is checked against
what arrives, never used to pick something from the cache (see `cache`). Every
failure becomes a `JobFailed` naming the field the tenant set (`model_url`,
`inputs_url`).
"""

from pathlib import Path

import httpx

from gpu_share.agent.cache import ArtifactCache, CachedFile, Fetched
from gpu_share.agent.client import CoordinatorClient, CoordinatorError, StaleLease
from gpu_share.agent.failures import JobFailed
from gpu_share.agent.settings import AgentSettings
from gpu_share.netguard import FetchError, SafeFetcher
from gpu_share.protocol import agent as wire
from gpu_share.protocol.errors import ErrorCode


async def fetch(
    ref: wire.ArtifactRef,
    field: str,
    *,
    settings: AgentSettings,
    cache: ArtifactCache,
    client: CoordinatorClient,
    fetcher: SafeFetcher,
) -> CachedFile:
    """The file behind `ref`, verified against its checksum and pinned in the cache."""

    async def from_platform(dest: Path, validators: dict[str, str]) -> Fetched:
        sha, size = await client.download(
            ref.url,
            dest,
            max_bytes=settings.max_download_bytes,
            timeout=settings.download_timeout_sec,
        )
        return Fetched(sha256=sha, size=size)

    async def from_origin(dest: Path, validators: dict[str, str]) -> Fetched:
        got = await fetcher.download(
            ref.url,
            dest,
            max_bytes=settings.max_download_bytes,
            timeout=settings.download_timeout_sec,
            headers=validators,
            expected_sha256=ref.sha256,
        )
        return Fetched(
            sha256=got.sha256,
            size=got.size,
            etag=got.etag,
            last_modified=got.last_modified,
            not_modified=got.not_modified,
        )

    try:
        if ref.platform and ref.sha256 is not None:
            cached = await cache.get_vouched(ref.sha256, from_platform)
        elif ref.platform:
            cached = await cache.get_revalidated(ref.url, from_platform)
        else:
            cached = await cache.get_revalidated(ref.url, from_origin)
    except FetchError as exc:
        raise JobFailed(exc.code, f"{field}: {exc.message}") from exc
    except StaleLease:
        raise
    except CoordinatorError as exc:
        raise JobFailed(ErrorCode.DOWNLOAD_FAILED, f"{field}: {exc.message}") from exc
    except (httpx.TransportError, TimeoutError) as exc:
        raise JobFailed(
            ErrorCode.DOWNLOAD_FAILED, f"{field}: download from the platform failed ({exc!r})"
        ) from exc
    if ref.sha256 is not None and cached.sha256 != ref.sha256:
        cache.unpin(cached.sha256)
        raise JobFailed(
            ErrorCode.CHECKSUM_MISMATCH,
            f"{field}: downloaded file has SHA-256 {cached.sha256}, expected {ref.sha256}",
        )
    return cached
