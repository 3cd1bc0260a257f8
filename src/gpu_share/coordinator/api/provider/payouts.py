"""A provider's earnings and payouts (SPEC §3.6), Bearer gpu_pk_…: only their own."""

from datetime import UTC, date
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from gpu_share.coordinator.api.auth import ProviderPrincipal
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.http.replica import ReplicaDep
from gpu_share.coordinator.services.money import chain_payouts, earnings, payouts
from gpu_share.coordinator.services.money.earnings_hold import HoldPolicy
from gpu_share.protocol.payouts import Earnings, Payout, PayoutSettings, PayoutSettingsUpdate

router = APIRouter(prefix="/v1/provider", tags=["provider"])

Since = Annotated[date | None, Query(description="First day (UTC), inclusive; default 30 days ago")]
Until = Annotated[date | None, Query(description="Last day (UTC), inclusive; default today")]


@router.get("/payout-settings", response_model=PayoutSettings, responses=errors(*AUTH))
async def get_payout_settings(provider: ProviderPrincipal, replica: ReplicaDep) -> PayoutSettings:
    async with replica.db.read() as session:
        return await payouts.get_settings(
            session,
            provider.provider_id,
            replica.clock.now().astimezone(UTC).date(),
            replica.settings.payout_minimum_micro,
        )


@router.put("/payout-settings", response_model=PayoutSettings, responses=errors(*AUTH, 422))
async def put_payout_settings(
    body: PayoutSettingsUpdate, provider: ProviderPrincipal, replica: ReplicaDep
) -> PayoutSettings:
    """Where and how often you are paid. A Solana address must be base58 of 32 bytes; an
    IBAN must pass its country's format and checksum and be in a region the platform pays
    by bank (SEPA unless its operator says otherwise), a BIC its format (422 otherwise)."""
    async with replica.db.write() as session:
        return await payouts.set_settings(
            session,
            provider.provider_id,
            body,
            replica.clock.now().astimezone(UTC).date(),
            replica.settings.payout_minimum_micro,
            bank_regions=replica.settings.bank_payout_regions,
        )


@router.get("/earnings", response_model=Earnings, responses=errors(*AUTH, 422))
async def get_earnings(
    provider: ProviderPrincipal, replica: ReplicaDep, since: Since = None, until: Until = None
) -> Earnings:
    """This week and month, per GPU and per GPU model, by day and charge by charge over
    `since`…`until` (at most 366 days), with the pending balance: what is still held (and
    on which days it becomes payable) and what is payable, the only money payouts pay."""
    async with replica.db.read() as session:
        return await earnings.earnings(
            session,
            provider.provider_id,
            replica.clock.now(),
            since,
            until,
            hold=HoldPolicy.of(replica.settings),
        )


@router.get(
    "/earnings.csv",
    response_class=Response,
    responses={**errors(*AUTH, 422), 200: {"content": {"text/csv": {}}}},
)
async def get_earnings_csv(
    provider: ProviderPrincipal, replica: ReplicaDep, since: Since = None, until: Until = None
) -> Response:
    """Every charge of the range, oldest first, one line each, with its `status` (held,
    payable or refunded) and, while held, when it becomes payable (`payable_at`)."""
    async with replica.db.read() as session:
        name, content = await earnings.earnings_csv(
            session,
            provider.provider_id,
            replica.clock.now(),
            since,
            until,
            hold=HoldPolicy.of(replica.settings),
        )
    return csv_response(name, content)


@router.get("/payouts", response_model=list[Payout], responses=errors(*AUTH))
async def get_payouts(provider: ProviderPrincipal, replica: ReplicaDep) -> list[Payout]:
    """Newest first: amount, method, status and, once paid, the transaction reference; a
    payout the platform sends on Solana also has its state, signature and explorer link."""
    async with replica.db.read() as session:
        found = await payouts.of_provider(session, provider.provider_id)
        return await chain_payouts.with_chain(session, found, replica.settings.solana_explorer_url)


def csv_response(name: str, content: str, media_type: str = "text/csv; charset=utf-8") -> Response:
    return Response(
        content,
        media_type=media_type,
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )
