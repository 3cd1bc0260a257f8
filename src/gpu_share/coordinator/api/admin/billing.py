"""Admin: crediting tenants' balances (SPEC §4.4)."""

from typing import Annotated

from fastapi import APIRouter, Header
from fastapi.responses import JSONResponse

from gpu_share.coordinator.api.auth import AdminPrincipal
from gpu_share.coordinator.api.paths import TenantId
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.http.replica import ReplicaDep
from gpu_share.coordinator.services.money import tenant_billing
from gpu_share.protocol.billing import TopUp, TopUpCreate

router = APIRouter(prefix="/v1/admin", tags=["admin"])


@router.post(
    "/tenants/{tenant_id}/top-ups",
    status_code=201,
    response_model=TopUp,
    responses={
        200: {"model": TopUp, "description": "Made before: nothing credited"},
        **errors(*AUTH, 404, 409, 422),
    },
)
async def top_up(
    tenant_id: TenantId,
    body: TopUpCreate,
    _admin: AdminPrincipal,
    replica: ReplicaDep,
    idempotency_key: Annotated[
        str | None,
        Header(
            max_length=120,
            description="Not needed: a top-up is made once per `reference`, whatever key "
            "comes with it. Accepted for clients that send one to every POST",
        ),
    ] = None,
) -> JSONResponse:
    """Credit a tenant's prepaid balance with a payment received (201). The same
    `reference` again answers 200 and credits nothing; with another amount it is 409."""
    async with replica.db.write() as session:
        made = await tenant_billing.top_up(
            session,
            tenant_id,
            body,
            idempotency_key=idempotency_key,
            admin="admin",
            now=replica.clock.now(),
        )
    return JSONResponse(made.model_dump(mode="json"), status_code=200 if made.replayed else 201)
