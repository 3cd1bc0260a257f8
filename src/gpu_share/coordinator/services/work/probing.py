"""`probe-url`: reachability through the same SSRF-safe fetcher the agents use."""

from datetime import datetime

from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.errors import ApiError
from gpu_share.coordinator.services.artifacts import artifacts
from gpu_share.coordinator.services.work.invokes import platform_artifact_id
from gpu_share.netguard import ProbeResult, SafeFetcher
from gpu_share.protocol.invokes import ProbeUrlResult

PROBE_TIMEOUT_SEC = 10.0


async def probe(
    db: Database,
    fetcher: SafeFetcher,
    tenant_id: str,
    url: str,
    *,
    origins: set[str],
    now: datetime,
) -> ProbeUrlResult:
    artifact_id = platform_artifact_id(url, origins)
    if artifact_id is not None:
        try:
            async with db.read() as session:
                download = await artifacts.open_download(
                    session, artifact_id, now, tenant_id=tenant_id
                )
        except ApiError as exc:
            return ProbeUrlResult(reachable=False, status_code=exc.status, error=exc.message)
        return ProbeUrlResult(
            reachable=True,
            status_code=200,
            content_length=download.artifact.size,
            content_type="application/octet-stream",
        )
    result: ProbeResult = await fetcher.probe(url, timeout=PROBE_TIMEOUT_SEC)
    return ProbeUrlResult(
        reachable=result.reachable,
        status_code=result.status_code,
        content_length=result.content_length,
        content_type=result.content_type,
        error=result.error,
    )
