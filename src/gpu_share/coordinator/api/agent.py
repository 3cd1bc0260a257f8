"""The agent protocol (see `gpu_share.protocol.agent`); the rules live in services."""

import asyncio
from typing import Annotated

from fastapi import APIRouter, Header, Request

from gpu_share.coordinator.api.deps import RuntimeDep, base_url
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.auth import AgentPrincipal, bearer_key
from gpu_share.coordinator.runtime import Runtime
from gpu_share.coordinator.services import job_files, leases, nodes, providers
from gpu_share.coordinator.services.accounts import Principal
from gpu_share.protocol import agent as wire
from gpu_share.protocol.artifacts import ArtifactKind
from gpu_share.protocol.common import Sha256Hex

router = APIRouter(prefix="/v1/agent", tags=["agent"])


def _node_id(principal: Principal) -> str:
    assert principal.node_id is not None, "agent keys always belong to a node"
    return principal.node_id


def _ack(runtime: Runtime, node_id: str) -> wire.InventoryAck:
    return wire.InventoryAck(
        node_id=node_id,
        heartbeat_interval_sec=runtime.settings.heartbeat_interval_sec,
        lease_ttl_sec=runtime.settings.lease_ttl_sec,
    )


@router.post(
    "/register",
    status_code=201,
    response_model=wire.RegistrationResult,
    responses=errors(401, 422),
)
async def register(
    body: wire.Registration, request: Request, runtime: RuntimeDep
) -> wire.RegistrationResult:
    """Register a node with the provider's enrollment token (Bearer gpu_et_…)."""
    token = bearer_key(request)
    async with runtime.db.write() as session:
        provider = await providers.provider_for_enrollment(session, token)
        node, node_key = await nodes.register(
            session, provider, body.inventory, runtime.clock.now()
        )
    return wire.RegistrationResult(node_key=node_key, **_ack(runtime, node.id).model_dump())


@router.put("/inventory", response_model=wire.InventoryAck, responses=errors(*AUTH, 422))
async def update_inventory(
    body: wire.NodeInventory, principal: AgentPrincipal, runtime: RuntimeDep
) -> wire.InventoryAck:
    """What the node has now (after an agent restart: GPUs, runtimes, capacity)."""
    async with runtime.db.write() as session:
        node = await nodes.update_inventory(session, _node_id(principal), body, runtime.clock.now())
    await runtime.notifier.publish()  # new runtimes may match queued work
    return _ack(runtime, node.id)


@router.post("/heartbeat", response_model=wire.HeartbeatAck, responses=errors(*AUTH, 422))
async def heartbeat(
    body: wire.Heartbeat, principal: AgentPrincipal, runtime: RuntimeDep
) -> wire.HeartbeatAck:
    async with runtime.db.write() as session:
        return await leases.heartbeat(
            session, _node_id(principal), body, runtime.clock.now(), runtime.settings
        )


@router.post("/lease", response_model=wire.LeaseResponse, responses=errors(*AUTH, 422))
async def lease(
    body: wire.LeaseRequest, request: Request, principal: AgentPrincipal, runtime: RuntimeDep
) -> wire.LeaseResponse:
    """Long-poll: answers as soon as work is queued for this node, or empty after `wait_sec`."""
    node_id = _node_id(principal)
    ctx = leases.LeaseContext(
        settings=runtime.settings,
        signer=runtime.signer,
        base_url=base_url(runtime, request),
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + min(body.wait_sec, runtime.settings.max_lease_wait_sec)
    while True:
        version = runtime.notifier.version
        async with runtime.db.write() as session:
            jobs = await leases.claim(session, node_id, body, runtime.clock.now(), ctx)
        remaining = deadline - loop.time()
        if jobs or remaining <= 0 or runtime.notifier.closed:
            return wire.LeaseResponse(jobs=jobs)
        await runtime.notifier.wait(version, remaining)


@router.post("/invokes/{invoke_id}/start", status_code=204, responses=errors(*AUTH, 409))
async def start(
    invoke_id: str, body: wire.StartReport, principal: AgentPrincipal, runtime: RuntimeDep
) -> None:
    async with runtime.db.write() as session:
        await leases.mark_started(
            session, _node_id(principal), invoke_id, body.lease_token, runtime.clock.now()
        )


@router.post(
    "/invokes/{invoke_id}/logs", response_model=wire.LogAck, responses=errors(*AUTH, 409, 422)
)
async def append_logs(
    invoke_id: str, body: wire.LogAppend, principal: AgentPrincipal, runtime: RuntimeDep
) -> wire.LogAck:
    async with runtime.db.write() as session:
        verdict = await leases.append_log(
            session, _node_id(principal), invoke_id, body, runtime.clock.now(), runtime.settings
        )
    return wire.LogAck(verdict=verdict)


_BINARY_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}
LeaseToken = Annotated[str, Header(alias=wire.LEASE_TOKEN_HEADER, max_length=64)]


@router.post(
    "/invokes/{invoke_id}/outputs",
    status_code=201,
    response_model=wire.OutputsStored,
    responses=errors(*AUTH, 409, 413, 422),
    openapi_extra=_BINARY_BODY,
)
async def store_outputs(
    invoke_id: str,
    request: Request,
    principal: AgentPrincipal,
    runtime: RuntimeDep,
    lease_token: LeaseToken,
    content_sha256: Sha256Hex | None = None,
) -> wire.OutputsStored:
    """Outputs over the inline limit, stored as an artifact of the invoke's tenant."""
    stored, _ = await job_files.store(
        runtime,
        node_id=_node_id(principal),
        invoke_id=invoke_id,
        lease_token=lease_token,
        kind=ArtifactKind.OUTPUTS,
        chunks=request.stream(),
        content_sha256=content_sha256,
        now=runtime.clock.now(),
        base_url=base_url(runtime, request),
    )
    return wire.OutputsStored(artifact_id=stored.id, url=stored.url)


@router.post(
    "/invokes/{invoke_id}/checkpoint",
    status_code=201,
    response_model=wire.CheckpointStored,
    responses=errors(*AUTH, 409, 413, 422),
    openapi_extra=_BINARY_BODY,
)
async def store_checkpoint(
    invoke_id: str,
    request: Request,
    principal: AgentPrincipal,
    runtime: RuntimeDep,
    lease_token: LeaseToken,
    content_sha256: Sha256Hex | None = None,
) -> wire.CheckpointStored:
    """A training snapshot; a requeued attempt of this invoke is leased with the newest one."""
    stored = await job_files.store_checkpoint(
        runtime,
        node_id=_node_id(principal),
        invoke_id=invoke_id,
        lease_token=lease_token,
        chunks=request.stream(),
        content_sha256=content_sha256,
        now=runtime.clock.now(),
        base_url=base_url(runtime, request),
    )
    return wire.CheckpointStored(artifact_id=stored.id, size=stored.size)


@router.post("/invokes/{invoke_id}/result", status_code=204, responses=errors(*AUTH, 404, 409, 422))
async def report_result(
    invoke_id: str, body: wire.ResultReport, principal: AgentPrincipal, runtime: RuntimeDep
) -> None:
    """The outcome, exactly once; a stale lease gets 409 and the job counts elsewhere."""
    async with runtime.db.write() as session:
        await leases.report_result(
            session, _node_id(principal), invoke_id, body, runtime.clock.now()
        )
