"""Benchmarks: agents report runs and measure the network to the coordinator; admins ask
for a run; tenants and providers read the results (`gpu_share.protocol.benchmarks`)."""

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import StreamingResponse

from gpu_share.coordinator.api.auth import (
    AdminPrincipal,
    NodePrincipal,
    ProviderPrincipal,
    TenantOrAdmin,
)
from gpu_share.coordinator.api.deps import ReplicaDep, base_url
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.core.errors import PayloadTooLarge
from gpu_share.coordinator.core.ids import id_pattern
from gpu_share.coordinator.services import benchmarks
from gpu_share.protocol import benchmarks as wire

router = APIRouter(tags=["benchmarks"])

NodeId = Annotated[str, Path(pattern=id_pattern("nod"), description="The node's id (nod_…)")]
ZEROS = bytes(1 << 20)


@router.post(
    "/v1/agent/benchmarks",
    status_code=201,
    response_model=wire.BenchmarkRun,
    responses=errors(*AUTH, 422),
)
async def report(
    body: wire.BenchmarkReport, request: Request, caller: NodePrincipal, replica: ReplicaDep
) -> wire.BenchmarkRun:
    """A run of the node's suite: scored against its GPUs' reference figures; a GPU below
    its tier's thresholds is delisted (and its provider mailed) until a run passes."""
    async with replica.db.write() as session:
        return await benchmarks.record(
            session, caller.node_id, body, replica.clock.now(), base_url(replica, request)
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


@router.post(
    "/v1/admin/nodes/{node_id}/benchmark",
    status_code=202,
    response_model=wire.BenchmarkRequested,
    responses=errors(*AUTH, 404, 422),
    tags=["admin"],
)
async def request_run(
    node_id: NodeId, _admin: AdminPrincipal, replica: ReplicaDep
) -> wire.BenchmarkRequested:
    """Ask the node to benchmark itself: its heartbeat answers say so until it reports a run
    (it starts once it has no job and no session)."""
    async with replica.db.write() as session:
        return await benchmarks.request(session, node_id, replica.clock.now())


@router.get(
    "/v1/provider/nodes/{node_id}/benchmarks",
    response_model=list[wire.BenchmarkRun],
    responses=errors(*AUTH, 404, 422),
    tags=["provider"],
)
async def provider_history(
    node_id: NodeId,
    provider: ProviderPrincipal,
    replica: ReplicaDep,
    limit: Annotated[int, Query(ge=1, le=benchmarks.HISTORY_LIMIT)] = 20,
) -> list[wire.BenchmarkRun]:
    """Your node's runs, newest first, with every figure, its reference and the verdicts."""
    async with replica.db.read() as session:
        await benchmarks.node_of_provider(session, node_id, provider.provider_id)
        return await benchmarks.history(session, node_id, limit)


@router.get(
    "/v1/nodes/{node_id}/benchmarks",
    response_model=wire.NodeBenchmark,
    responses=errors(*AUTH, 404, 422),
    tags=["discovery"],
)
async def latest(
    node_id: NodeId, _viewer: TenantOrAdmin, replica: ReplicaDep
) -> wire.NodeBenchmark:
    """The node's latest benchmark run: each GPU's score, its figures against its model's
    datasheet, and whether it passed; `latest` is null until the node has run one."""
    async with replica.db.read() as session:
        await benchmarks.node_exists(session, node_id)
        runs = await benchmarks.history(session, node_id, 1, with_errors=False)
    return wire.NodeBenchmark(node_id=node_id, latest=runs[0] if runs else None)
