"""Earnings for tests: CHARGE transactions posted straight to the books, as the billing
code posts them (held, or as before earnings were held: payable), and a frozen clock
moved to a given moment."""

from datetime import datetime, timedelta

from gpu_share.coordinator.core.clock import FrozenClock
from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.ids import new_id
from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.coordinator.services.money import earnings_hold, ledger
from gpu_share.coordinator.services.money.ledger import ChargeDetails, Entry, TransactionKind


def move_to(clock: FrozenClock, moment: datetime) -> None:
    clock.advance((moment - clock.now()).total_seconds())


async def post_charge(
    db: Database,
    provider_id: str,
    *,
    at: datetime,
    provider_micro: int,
    commission_micro: int = 0,
    node_id: str = "node_test",
    gpu_model: str = "NVIDIA H100 80GB HBM3",
    gpus: int = 1,
    seconds: float = 3600.0,
    held: bool = False,
) -> str:
    """One charge paid by the outside world (no tenant needed): its cause.

    `held`: as billing posts a charge, into the provider's held earnings with its hold
    recorded (the node's, when `node_id` is registered); otherwise as a charge posted
    before earnings were held, straight into their pending (payable) earnings."""
    cost = provider_micro + commission_micro
    work_id = new_id("inv")
    details: ChargeDetails = {
        "tenant_id": "ten_test",
        "provider_id": provider_id,
        "node_id": node_id,
        "work": "invoke",
        "work_id": work_id,
        "runtime": "onnx_cuda",
        "gpu_model": gpu_model,
        "gpus": gpus,
        "spot": False,
        "seconds": seconds,
        "rate_micro_per_hour": round(cost * 3600 / seconds) if seconds else 0,
        "cost_micro": cost,
        "provider_micro": provider_micro,
        "commission_micro": commission_micro,
        "started_at": (at - timedelta(seconds=seconds)).isoformat(),
        "ended_at": at.isoformat(),
    }
    cause = f"invoke:{work_id}:charge"
    entries = [
        Entry(ledger.WORLD, -cost),
        Entry(
            (ledger.provider_held if held else ledger.provider_pending)(provider_id),
            provider_micro,
        ),
        Entry(ledger.COMMISSION, commission_micro),
    ]
    async with db.write() as session:
        await ledger.post(
            session,
            cause=cause,
            kind=TransactionKind.CHARGE,
            entries=entries,
            now=at,
            details=dict(details),
        )
        if held:
            node = await session.get(NodeRow, node_id) or NodeRow(
                id=node_id, provider_id=provider_id, gpus=[], verification=None
            )
            await earnings_hold.hold_charge(session, cause, node, provider_micro)
    return cause
