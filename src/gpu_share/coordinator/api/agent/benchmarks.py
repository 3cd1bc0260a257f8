"""Benchmarks from the agent's side: it reports runs and measures the network to the
coordinator (`gpu_share.protocol.benchmarks`). Admins ask for a run (`admin/providers.py`);
providers (`provider/account.py`) and tenants (`tenant/nodes.py`) read the results."""

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from gpu_share.coordinator.api.auth import (
    NodePrincipal,
)
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.core.errors import PayloadTooLarge
from gpu_share.coordinator.http.replica import ReplicaDep
from gpu_share.coordinator.services.providers import benchmarks
from gpu_share.protocol import benchmarks as wire

router = APIRouter(tags=["benchmarks"])

ZEROS = bytes(1 << 20)


@router.post(
    "/v1/agent/benchmarks",
    status_code=201,
    response_model=wire.BenchmarkRun,
    responses=errors(*AUTH, 422),
)
async def report(
    body: wire.BenchmarkReport, caller: NodePrincipal, replica: ReplicaDep
) -> wire.BenchmarkRun:
    """A run of the node's suite: scored against its GPUs' reference figures; a GPU below
    its tier's thresholds is delisted (and its provider mailed) until a run passes."""
    async with replica.db.write() as session:
        return await benchmarks.record(
            session, caller.node_id, body, replica.clock.now(), replica.settings.mail_base_url
        )


@router.get("/v1/agent/benchmarks/ping", responses=errors(*AUTH))
async def ping(_caller: NodePrincipal) -> dict[str, bool]:
    """A tiny answer: the agent times round trips with it."""
    return {"ok": True}


@router.get(
    "/v1/agent/benchmarks/download",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "`bytes` zero bytes",
            "content": {"application/octet-stream": {"schema": {"type": "string"}}},
        },
        **errors(*AUTH, 422),
    },
)
async def download(
    _caller: NodePrincipal,
    nbytes: Annotated[
        int, Query(alias="bytes", ge=1, le=wire.MAX_DOWNLOAD_BYTES, description="How many")
    ],
) -> StreamingResponse:
    """Streams zeros, for the agent's download throughput."""

    async def zeros() -> AsyncIterator[bytes]:
        left = nbytes
        while left > 0:
            chunk = ZEROS[: min(left, len(ZEROS))]
            left -= len(chunk)
            yield chunk

    return StreamingResponse(
        zeros(),
        media_type="application/octet-stream",
        headers={"Content-Length": str(nbytes), "Cache-Control": "no-store"},
    )


@router.post(
    "/v1/agent/benchmarks/upload",
    response_model=wire.ProbeUpload,
    responses=errors(*AUTH, 413),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/octet-stream": {"schema": {"type": "string"}}},
        }
    },
)
async def upload(request: Request, _caller: NodePrincipal) -> wire.ProbeUpload:
    """Reads the body and drops it, for the agent's upload throughput."""
    limit = wire.MAX_UPLOAD_BYTES
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"an upload probe may be at most {limit} bytes")
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        if received > limit:
            raise PayloadTooLarge(f"an upload probe may be at most {limit} bytes")
    return wire.ProbeUpload(received_bytes=received)
