"""Admin: payout batches, their export for execution, and marking payouts paid or failed
(SPEC §3.6)."""

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query
from fastapi.responses import Response

from gpu_share.coordinator.api.auth import AdminPrincipal
from gpu_share.coordinator.api.provider.payouts import csv_response
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.core.ids import id_pattern
from gpu_share.coordinator.http.replica import ReplicaDep
from gpu_share.coordinator.services.money import payout_batches, payouts
from gpu_share.protocol.payouts import (
    ManualPayout,
    MarkFailed,
    MarkPaid,
    Payout,
    PayoutBatch,
    PayoutBatchDetail,
)

router = APIRouter(prefix="/v1/admin", tags=["admin"])

BatchId = Annotated[str, Path(pattern=id_pattern("pbat"))]
PayoutId = Annotated[str, Path(pattern=id_pattern("pay"))]
ProviderId = Annotated[str, Path(pattern=id_pattern("prv"))]


@router.get("/payout-batches", response_model=list[PayoutBatch], responses=errors(*AUTH))
async def list_payout_batches(_admin: AdminPrincipal, replica: ReplicaDep) -> list[PayoutBatch]:
    """Newest first, with each batch's count, total and payouts still in transit."""
    async with replica.db.read() as session:
        return await payout_batches.batches(session)


@router.get(
    "/payout-batches/{batch_id}",
    response_model=PayoutBatchDetail,
    responses=errors(*AUTH, 404, 422),
)
async def get_payout_batch(
    batch_id: BatchId, _admin: AdminPrincipal, replica: ReplicaDep
) -> PayoutBatchDetail:
    async with replica.db.read() as session:
        return await payout_batches.batch(session, batch_id)


@router.get(
    "/payout-batches/{batch_id}/export",
    response_class=Response,
    responses={
        **errors(*AUTH, 404, 422),
        200: {"content": {"text/csv": {}, "application/json": {}}},
    },
)
async def export_payout_batch(
    batch_id: BatchId,
    _admin: AdminPrincipal,
    replica: ReplicaDep,
    format: Annotated[Literal["csv", "json"], Query()] = "csv",
) -> Response:
    """The batch for execution, one line per payout with its method's details; the first
    export is recorded as `exported_at`."""
    async with replica.db.write() as session:
        name, media_type, content = await payout_batches.export(
            session, batch_id, format, replica.clock.now()
        )
    return csv_response(name, content, media_type)


@router.post(
    "/payouts/{payout_id}/paid", response_model=Payout, responses=errors(*AUTH, 404, 409, 422)
)
async def mark_payout_paid(
    payout_id: PayoutId,
    body: MarkPaid,
    _admin: AdminPrincipal,
    replica: ReplicaDep,
) -> Payout:
    """Executed: record its transaction reference; the provider is mailed it. 409 unless the
    payout is in transit."""
    async with replica.db.write() as session:
        return await payouts.mark_paid(
            session, payout_id, body.reference, replica.clock.now(), replica.settings.mail_base_url
        )


@router.post(
    "/payouts/{payout_id}/failed", response_model=Payout, responses=errors(*AUTH, 404, 409, 422)
)
async def mark_payout_failed(
    payout_id: PayoutId,
    body: MarkFailed,
    _admin: AdminPrincipal,
    replica: ReplicaDep,
) -> Payout:
    """Not executed: the amount returns to the provider's pending balance and they are
    mailed the reason. 409 unless the payout is in transit."""
    async with replica.db.write() as session:
        return await payouts.mark_failed(
            session, payout_id, body.reason, replica.clock.now(), replica.settings.mail_base_url
        )


@router.post(
    "/providers/{provider_id}/payouts",
    response_model=Payout,
    status_code=201,
    responses=errors(*AUTH, 402, 404, 409, 422),
)
async def pay_out_now(
    provider_id: ProviderId,
    body: ManualPayout,
    _admin: AdminPrincipal,
    replica: ReplicaDep,
) -> Payout:
    """A payout outside the schedule (in no batch). 402 when the amount is more than the
    provider's pending balance, 409 when they have no payout method; nothing changes."""
    async with replica.db.write() as session:
        return await payouts.pay_out_now(
            session, provider_id, body.amount, replica.clock.now(), replica.settings.mail_base_url
        )
