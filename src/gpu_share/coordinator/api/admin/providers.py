"""Admin: reviewing provider applications (SPEC §3.1, §3.5), asking a node for a benchmark
run (SPEC §3.3), and reading the outbox."""

from typing import Annotated

from fastapi import APIRouter, Path, Query

from gpu_share.coordinator.api.auth import AdminPrincipal
from gpu_share.coordinator.api.paths import NodeId
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.core.errors import field_error
from gpu_share.coordinator.core.ids import id_pattern
from gpu_share.coordinator.http.replica import ReplicaDep
from gpu_share.coordinator.services.mail import outbox
from gpu_share.coordinator.services.providers import benchmarks, provider_applications
from gpu_share.protocol import benchmarks as benchmarks_wire
from gpu_share.protocol import provider_applications as wire
from gpu_share.protocol.accounts import Rejection
from gpu_share.protocol.outbox import OutboxMail, OutboxState

router = APIRouter(prefix="/v1/admin", tags=["admin"])

ApplicationId = Annotated[str, Path(pattern=id_pattern("papp"))]


@router.get(
    "/provider-applications",
    response_model=list[wire.ProviderApplication],
    responses=errors(*AUTH, 422),
)
async def list_provider_applications(
    _admin: AdminPrincipal, replica: ReplicaDep, status: wire.ApplicationStatus | None = None
) -> list[wire.ProviderApplication]:
    """Newest first; filter by status (pending, info_requested, approved, rejected)."""
    async with replica.db.read() as session:
        return await provider_applications.list_applications(session, status)


@router.get(
    "/provider-applications/{application_id}",
    response_model=wire.ProviderApplication,
    responses=errors(*AUTH, 404, 422),
)
async def get_provider_application(
    application_id: ApplicationId, _admin: AdminPrincipal, replica: ReplicaDep
) -> wire.ProviderApplication:
    async with replica.db.read() as session:
        return await provider_applications.get(session, application_id)


@router.post(
    "/provider-applications/{application_id}/approve",
    response_model=wire.Approved,
    responses=errors(*AUTH, 404, 409, 422),
)
async def approve_provider_application(
    application_id: ApplicationId,
    body: wire.Approval,
    _admin: AdminPrincipal,
    replica: ReplicaDep,
) -> wire.Approved:
    """Create the provider; the applicant is mailed a one-time link to their key and token."""
    async with replica.db.write() as session:
        return await provider_applications.approve(
            session, application_id, body.tier, replica.clock.now(), replica.settings.mail_base_url
        )


@router.post(
    "/provider-applications/{application_id}/reject",
    response_model=wire.ProviderApplication,
    responses=errors(*AUTH, 404, 409, 422),
)
async def reject_provider_application(
    application_id: ApplicationId, body: Rejection, _admin: AdminPrincipal, replica: ReplicaDep
) -> wire.ProviderApplication:
    async with replica.db.write() as session:
        return await provider_applications.reject(
            session, application_id, body.reason, replica.clock.now()
        )


@router.post(
    "/provider-applications/{application_id}/request-info",
    response_model=wire.ProviderApplication,
    responses=errors(*AUTH, 404, 409, 422),
)
async def request_information(
    application_id: ApplicationId,
    body: wire.InfoRequest,
    _admin: AdminPrincipal,
    replica: ReplicaDep,
) -> wire.ProviderApplication:
    """Ask the applicant for more; they amend the application through their status link."""
    async with replica.db.write() as session:
        return await provider_applications.request_info(
            session,
            application_id,
            body.message,
            replica.clock.now(),
            replica.settings.mail_base_url,
            replica.signer,
        )


@router.get("/outbox", response_model=list[OutboxMail], responses=errors(*AUTH, 422))
async def list_outbox(
    _admin: AdminPrincipal,
    replica: ReplicaDep,
    unsent: Annotated[bool, Query(description="Only the mails still waiting to go")] = False,
    failed: Annotated[
        bool, Query(description="Only the mails given up, each with its last_error")
    ] = False,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> list[OutboxMail]:
    """Mail the platform sent or will send; with no SMTP configured, all of it waits here.
    A mail that could not be built or sent for good is failed, with its reason."""
    if unsent and failed:
        raise field_error("failed", "ask for the waiting mails or the failed ones, not both")
    state = OutboxState.WAITING if unsent else OutboxState.FAILED if failed else None
    async with replica.db.read() as session:
        return await outbox.list_mails(session, state=state, limit=limit)


@router.post(
    "/nodes/{node_id}/benchmark",
    status_code=202,
    response_model=benchmarks_wire.BenchmarkRequested,
    responses=errors(*AUTH, 404, 422),
    tags=["benchmarks"],
)
async def request_run(
    node_id: NodeId, _admin: AdminPrincipal, replica: ReplicaDep
) -> benchmarks_wire.BenchmarkRequested:
    """Ask the node to benchmark itself: its heartbeat answers say so until it reports a run
    (it starts once it has no job and no session)."""
    async with replica.db.write() as session:
        return await benchmarks.request(session, node_id, replica.clock.now())
