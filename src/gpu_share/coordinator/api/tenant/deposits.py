"""Tenant self-serve USDC top-ups on Solana (docs/billing.md, "Top up with USDC"):
asking for a deposit address and reference, and reading what arrived."""

from fastapi import APIRouter

from gpu_share.coordinator.api.auth import TenantPrincipal
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.http.replica import ReplicaDep
from gpu_share.coordinator.services.money import deposits
from gpu_share.protocol.deposits import Deposit, DepositCreate

router = APIRouter(tags=["billing"])


@router.post(
    "/v1/billing/deposits",
    response_model=Deposit,
    status_code=201,
    responses=errors(*AUTH, 409, 422),
)
async def create_deposit(
    tenant: TenantPrincipal, replica: ReplicaDep, body: DepositCreate | None = None
) -> Deposit:
    """Where to send USDC and the reference key to name in the transfer; each finalized
    transfer naming it is credited once, with what arrived. 409 when USDC top-ups are
    not set up on this platform."""
    async with replica.db.write() as session:
        return await deposits.request(
            session,
            tenant.tenant_id,
            body.amount if body else None,
            deposits.target_of(replica.settings),
            replica.clock.now(),
        )


@router.get("/v1/billing/deposits", response_model=list[Deposit], responses=errors(*AUTH))
async def list_deposits(tenant: TenantPrincipal, replica: ReplicaDep) -> list[Deposit]:
    """This tenant's latest 20 deposit requests, newest first, with what arrived."""
    async with replica.db.read() as session:
        return await deposits.of_tenant(
            session, tenant.tenant_id, deposits.target_of(replica.settings)
        )
