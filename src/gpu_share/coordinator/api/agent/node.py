"""The agent protocol (see `gpu_share.protocol.agent`); the rules live in services."""

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request

from gpu_share.coordinator.api.auth import NodePrincipal
from gpu_share.coordinator.api.deps import lease_context
from gpu_share.coordinator.api.paths import InvokeId
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.http.principals import bearer_key
from gpu_share.coordinator.http.replica import ReplicaDep, base_url
from gpu_share.coordinator.replica.notify import Channel
from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.nodes import nodes
from gpu_share.coordinator.services.providers import enrollment
from gpu_share.coordinator.services.trust import challenges
from gpu_share.coordinator.services.work import claims, job_files, lease_polls, leases, preemption
from gpu_share.coordinator.services.work.invoke_state import Lease
from gpu_share.protocol import agent as wire
from gpu_share.protocol.artifacts import ArtifactKind
from gpu_share.protocol.common import Sha256Hex

router = APIRouter(prefix="/v1/agent", tags=["agent"])
# A dependency, so a request without the token is refused before its body is validated.
EnrollmentToken = Annotated[str, Depends(bearer_key)]


def _ack(replica: Replica, node_id: str) -> wire.InventoryAck:
    return wire.InventoryAck(
        node_id=node_id,
        heartbeat_interval_sec=replica.settings.heartbeat_interval_sec,
        lease_ttl_sec=replica.settings.lease_ttl_sec,
    )


@router.post(
    "/register",
    status_code=201,
    response_model=wire.RegistrationResult,
    responses=errors(401, 403, 422),
)
async def register(
    body: wire.Registration, token: EnrollmentToken, replica: ReplicaDep
) -> wire.RegistrationResult:
    """Register a machine with the provider's enrollment token (Bearer gpu_et_…).

    A machine the provider registered before (the same fingerprint or a GPU UUID) gets its
    node back, with its record; the keys issued for it before are revoked. 401: the token
    is unknown, expired or revoked; 403: the hardware belongs to a quarantined node, or to
    another provider's node (`error.details.reason` says which)."""
    async with replica.db.write() as session:
        enrolled = await enrollment.enroll(session, token, body.inventory, replica.clock.now())
    if enrolled.returning:
        replica.key_cache.clear()  # the node's old keys stop here at once, elsewhere within seconds
    return wire.RegistrationResult(
        node_key=enrolled.node_key,
        returning=enrolled.returning,
        **_ack(replica, enrolled.node_id).model_dump(),
    )


@router.put("/inventory", response_model=wire.InventoryAck, responses=errors(*AUTH, 403, 422))
async def update_inventory(
    body: wire.NodeInventory, caller: NodePrincipal, replica: ReplicaDep
) -> wire.InventoryAck:
    """What the node has now (after an agent restart: GPUs, runtimes, capacity)."""
    async with replica.db.write() as session:
        node = await nodes.update_inventory(session, caller.node_id, body, replica.clock.now())
    await replica.notifier.publish(Channel.WORK)  # new runtimes may match queued work
    return _ack(replica, node.id)


@router.post("/heartbeat", response_model=wire.HeartbeatAck, responses=errors(*AUTH, 422))
async def heartbeat(
    body: wire.Heartbeat, caller: NodePrincipal, replica: ReplicaDep
) -> wire.HeartbeatAck:
    beat = await leases.heartbeat(
        replica.db, caller.node_id, body, replica.clock.now(), replica.settings
    )
    if beat.challenge_waiting:
        beat.ack.challenge = await challenges.waiting(replica.db, caller.node_id)
    return beat.ack


@router.post("/lease", response_model=wire.LeaseResponse, responses=errors(*AUTH, 422))
async def lease(
    body: wire.LeaseRequest, request: Request, caller: NodePrincipal, replica: ReplicaDep
) -> wire.LeaseResponse:
    """Long-poll: answers as soon as work is queued for this node, or empty after `wait_sec`."""
    jobs = await lease_polls.poll(
        replica.db,
        replica.notifier,
        replica.claim_gate,
        replica.clock,
        caller.node_id,
        body,
        lease_context(replica, request),
        wait_sec=min(body.wait_sec, replica.settings.max_lease_wait_sec),
    )
    return wire.LeaseResponse(jobs=jobs)


@router.post("/invokes/{invoke_id}/start", status_code=204, responses=errors(*AUTH, 409))
async def start(
    invoke_id: InvokeId, body: wire.StartReport, caller: NodePrincipal, replica: ReplicaDep
) -> None:
    async with replica.db.write() as session:
        await leases.mark_started(
            session, Lease(invoke_id, caller.node_id, body.lease_token), replica.clock.now()
        )


@router.post(
    "/invokes/{invoke_id}/logs", response_model=wire.LogAck, responses=errors(*AUTH, 409, 422)
)
async def append_logs(
    invoke_id: InvokeId, body: wire.LogAppend, caller: NodePrincipal, replica: ReplicaDep
) -> wire.LogAck:
    async with replica.db.write() as session:
        verdict = await leases.append_log(
            session,
            Lease(invoke_id, caller.node_id, body.lease_token),
            body.text,
            replica.clock.now(),
            replica.settings,
        )
    return wire.LogAck(verdict=verdict)


_BINARY_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


def _files(replica: Replica) -> job_files.JobFileStore:
    return job_files.JobFileStore(replica.db, replica.store, replica.settings)


LeaseToken = Annotated[str, Header(alias=wire.LEASE_TOKEN_HEADER, max_length=64)]


@router.post(
    "/invokes/{invoke_id}/outputs",
    status_code=201,
    response_model=wire.OutputsStored,
    responses=errors(*AUTH, 409, 413, 422),
    openapi_extra=_BINARY_BODY,
)
async def store_outputs(
    invoke_id: InvokeId,
    request: Request,
    caller: NodePrincipal,
    replica: ReplicaDep,
    lease_token: LeaseToken,
    content_sha256: Sha256Hex | None = None,
) -> wire.OutputsStored:
    """Outputs over the inline limit, stored as an artifact of the invoke's tenant."""
    stored, _ = await job_files.store(
        _files(replica),
        Lease(invoke_id, caller.node_id, lease_token),
        ArtifactKind.OUTPUTS,
        request.stream(),
        content_sha256=content_sha256,
        now=replica.clock.now(),
        base_url=base_url(replica, request),
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
    invoke_id: InvokeId,
    request: Request,
    caller: NodePrincipal,
    replica: ReplicaDep,
    lease_token: LeaseToken,
    content_sha256: Sha256Hex | None = None,
) -> wire.CheckpointStored:
    """A training snapshot; a requeued attempt of this invoke is leased with the newest one."""
    stored = await job_files.store_checkpoint(
        _files(replica),
        Lease(invoke_id, caller.node_id, lease_token),
        request.stream(),
        content_sha256=content_sha256,
        now=replica.clock.now(),
        base_url=base_url(replica, request),
    )
    return wire.CheckpointStored(artifact_id=stored.id, size=stored.size)


@router.post("/invokes/{invoke_id}/preempted", status_code=204, responses=errors(*AUTH, 409, 422))
async def report_preempted(
    invoke_id: InvokeId, body: wire.PreemptedReport, caller: NodePrincipal, replica: ReplicaDep
) -> None:
    """The job stopped at a PREEMPT verdict; it is requeued (409 when the lease is stale)."""
    async with replica.db.write() as session:
        await preemption.confirm(
            session,
            Lease(invoke_id, caller.node_id, body.lease_token),
            replica.clock.now(),
            replica.settings,
        )
    await replica.notifier.publish(Channel.WORK)


@router.post(
    "/invokes/{invoke_id}/result",
    response_model=wire.LeaseResponse,
    responses=errors(*AUTH, 409, 422),
)
async def report_result(
    invoke_id: InvokeId,
    body: wire.ResultReport,
    request: Request,
    caller: NodePrincipal,
    replica: ReplicaDep,
) -> wire.LeaseResponse:
    """The outcome, exactly once; a stale lease gets 409 and the job counts elsewhere.

    With `next`, the node's next work is leased in its own transaction once the result
    is recorded, and comes back in `jobs` (empty otherwise)."""
    async with replica.db.write() as session:
        await leases.report_result(
            session,
            Lease(invoke_id, caller.node_id, body.lease_token),
            body,
            replica.clock.now(),
            replica.settings,
        )
    # Other replicas heard it at the commit (`invoke_state.finish`).
    replica.notifier.told_by_commit(Channel.FINISHED, invoke_id)
    if body.next is None or replica.notifier.closed:
        return wire.LeaseResponse(jobs=[])
    async with replica.claim_gate, replica.db.write() as session:
        jobs = await claims.claim(
            session,
            caller.node_id,
            body.next,
            replica.clock.now(),
            lease_context(replica, request),
        )
    return wire.LeaseResponse(jobs=jobs)
