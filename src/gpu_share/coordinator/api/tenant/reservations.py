"""Tenant reservations (SPEC §4.3, dedicated): whole GPUs of one node for a period."""

from typing import Annotated

from fastapi import APIRouter, Path, Query
from fastapi.responses import JSONResponse

from gpu_share.coordinator.api.auth import TenantPrincipal
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.core.ids import id_pattern
from gpu_share.coordinator.http.replica import ReplicaDep
from gpu_share.coordinator.services.rentals import reservation_billing, reservations
from gpu_share.protocol.common import Page
from gpu_share.protocol.reservations import Reservation, ReservationQuote, ReservationRequest

router = APIRouter(prefix="/v1/reservations", tags=["reservations"])

ReservationId = Annotated[
    str, Path(pattern=id_pattern("rsv"), description="The reservation's id (rsv_…)")
]


@router.post("/quote", response_model=ReservationQuote, responses=errors(*AUTH, 404, 409, 422, 503))
async def quote_reservation(
    body: ReservationRequest, tenant: TenantPrincipal, replica: ReplicaDep
) -> ReservationQuote:
    """The node, GPUs and price `POST /v1/reservations` would get now; reserves nothing."""
    async with replica.db.read() as session:
        return await reservations.quote(
            session, tenant.tenant_id, body, replica.clock.now(), replica.settings
        )


@router.post(
    "",
    status_code=201,
    response_model=Reservation,
    responses=errors(*AUTH, 402, 404, 409, 422, 503),
)
async def create_reservation(
    body: ReservationRequest, tenant: TenantPrincipal, replica: ReplicaDep
) -> JSONResponse:
    """Reserve: the period's price moves from the balance to the reserve now."""
    created = await reservations.book(
        replica.db, tenant.tenant_id, body, replica.clock.now(), replica.settings
    )
    return JSONResponse(
        created.model_dump(mode="json"),
        status_code=201,
        headers={"Location": f"/v1/reservations/{created.id}"},
    )


@router.get("", response_model=Page[Reservation], responses=errors(*AUTH, 422))
async def list_reservations(
    tenant: TenantPrincipal,
    replica: ReplicaDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 100,
) -> Page[Reservation]:
    """This tenant's reservations, newest first."""
    async with replica.db.read() as session:
        found = await reservations.list_for_tenant(session, tenant.tenant_id, limit=limit)
    return Page[Reservation](items=found, next_cursor=None)


@router.get("/{reservation_id}", response_model=Reservation, responses=errors(*AUTH, 404, 422))
async def get_reservation(
    reservation_id: ReservationId, tenant: TenantPrincipal, replica: ReplicaDep
) -> Reservation:
    async with replica.db.read() as session:
        return await reservations.get(session, tenant.tenant_id, reservation_id)


@router.post(
    "/{reservation_id}/cancel", response_model=Reservation, responses=errors(*AUTH, 404, 409, 422)
)
async def cancel_reservation(
    reservation_id: ReservationId, tenant: TenantPrincipal, replica: ReplicaDep
) -> Reservation:
    """Free before it starts; after, every hour begun is charged and the rest released."""
    async with replica.db.write() as session:
        return await reservation_billing.cancel(
            session, tenant.tenant_id, reservation_id, replica.clock.now()
        )
