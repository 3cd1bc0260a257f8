"""Providers' prices (SPEC §3.4): a rate per GPU model, and what a node charges for it.

A provider sets, per GPU model it runs ("cpu" for CPU nodes), a rate in micro-USDC per
GPU-hour and a spot discount (30–70 %). A change applies to work placed after it: the
rate is fixed on each invoke and session when it is placed.
"""

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.orm import NodeRow, ProviderPriceRow

CPU_MODEL = "cpu"  # the "GPU model" a CPU node's price is set for


def models_of(node: NodeRow) -> list[str]:
    """The GPU models a node runs, as prices are keyed; ["cpu"] for a CPU node."""
    models = sorted({str(g.get("model")) for g in node.gpus if g.get("model")})
    return models or [CPU_MODEL]


def spot_rate(price_micro: int, spot_discount_bps: int) -> int:
    """The spot rate: the discount taken off, rounded down to the micro-USDC."""
    return price_micro - price_micro * spot_discount_bps // 10_000


async def hourly_rate(session: AsyncSession, node: NodeRow, *, spot: bool) -> int:
    """Micro-USDC per GPU-hour the node charges new work now (spot or on demand); 0 while
    its provider has set no price for its GPU model. A node with several models charges
    the highest of their prices."""
    rows = (
        await session.scalars(
            select(ProviderPriceRow).where(
                ProviderPriceRow.provider_id == node.provider_id,
                ProviderPriceRow.gpu_model.in_(models_of(node)),
            )
        )
    ).all()
    rates = [
        spot_rate(r.price_micro_per_hour, r.spot_discount_bps) if spot else r.price_micro_per_hour
        for r in rows
    ]
    return max(rates, default=0)
