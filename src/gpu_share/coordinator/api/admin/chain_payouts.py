"""Admin: the USDC payouts the platform sends on Solana (docs/payouts.md, "Payouts on
Solana"): those awaiting approval or being sent, and approving one above the limits."""

from typing import Annotated

from fastapi import APIRouter, Path

from gpu_share.coordinator.api.auth import AdminPrincipal
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.core.ids import id_pattern
from gpu_share.coordinator.http.replica import ReplicaDep
from gpu_share.coordinator.services.money import chain_payouts
from gpu_share.protocol.payouts import ChainPayout

router = APIRouter(prefix="/v1/admin", tags=["admin"])

PayoutId = Annotated[str, Path(pattern=id_pattern("pay"))]


@router.get("/chain-payouts", response_model=list[ChainPayout], responses=errors(*AUTH))
async def list_chain_payouts(_admin: AdminPrincipal, replica: ReplicaDep) -> list[ChainPayout]:
    """Awaiting approval or being sent, oldest first, with the latest signature sent."""
    async with replica.db.read() as session:
        return await chain_payouts.open_payouts(session, replica.settings.solana_explorer_url)


@router.post(
    "/payouts/{payout_id}/approve", status_code=204, responses=errors(*AUTH, 404, 409, 422)
)
async def approve_chain_payout(
    payout_id: PayoutId, _admin: AdminPrincipal, replica: ReplicaDep
) -> None:
    """Let a payout above the per-payout or per-day limit be sent. 409 unless it awaits
    approval."""
    async with replica.db.write() as session:
        await chain_payouts.approve(session, payout_id, replica.clock.now())
