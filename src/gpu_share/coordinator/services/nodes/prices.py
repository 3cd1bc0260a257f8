"""Providers' prices (SPEC §3.4): a rate per GPU model, and what a node charges for it.

A provider sets, per GPU model it runs ("cpu" for CPU nodes), a rate in micro-USDC per
GPU-hour and a spot discount (30–70 %). A change applies to work placed after it: the
rate is fixed on each invoke and session when it is placed.

`NodeRow.price_per_gpu_hour_micro` is the node's on-demand rate kept denormalised for
placement, ranking and the marketplace: `refresh_node` rewrites it whenever a price is
set or removed and whenever the node's inventory changes.
"""

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.db import driver_of
from gpu_share.coordinator.core.driver_sql import Sql
from gpu_share.coordinator.core.errors import NotFound, ValidationFailed
from gpu_share.coordinator.core.orm import NodeRow, ProviderPriceRow
from gpu_share.protocol.money import usdc_text
from gpu_share.protocol.prices import Price, PriceUpdate, ProviderPrices

CPU_MODEL = "cpu"  # the "GPU model" a CPU node's price is set for


def models_of(node: NodeRow) -> list[str]:
    """The GPU models a node runs, as prices are keyed; ["cpu"] for a CPU node."""
    models = sorted({str(g.get("model")) for g in node.gpus if g.get("model")})
    return models or [CPU_MODEL]


def spot_rate(price_micro: int, spot_discount_bps: int) -> int:
    """The spot rate: the discount taken off, rounded down to the micro-USDC."""
    return price_micro - price_micro * spot_discount_bps // 10_000


class PriceLike(Protocol):
    """A provider's price for one model: a `ProviderPriceRow`, or a `Rate` read on the
    driver."""

    @property
    def provider_id(self) -> str: ...
    @property
    def gpu_model(self) -> str: ...
    @property
    def price_micro_per_hour(self) -> int: ...
    @property
    def spot_discount_bps(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Rate:
    provider_id: str
    gpu_model: str
    price_micro_per_hour: int
    spot_discount_bps: int


def _rate(node: NodeRow, prices: Iterable[PriceLike], *, spot: bool) -> int:
    models = set(models_of(node))
    rates = [
        spot_rate(r.price_micro_per_hour, r.spot_discount_bps) if spot else r.price_micro_per_hour
        for r in prices
        if r.provider_id == node.provider_id and r.gpu_model in models
    ]
    return max(rates, default=0)


_PRICES_OF_PROVIDER = Sql(
    "SELECT provider_id, gpu_model, price_micro_per_hour, spot_discount_bps"
    " FROM provider_prices WHERE provider_id = :provider"
)
"""A provider's prices (a few rows: one per model it runs); on the driver (`driver_sql`):
every lease reads it."""


async def hourly_rate(session: AsyncSession, node: NodeRow, *, spot: bool) -> int:
    """Micro-USDC per GPU-hour the node charges new work now (spot or on demand); 0 while
    its provider has set no price for its GPU model. A node with several models charges
    the highest of their prices.

    On demand, that is the node's own denormalised rate, with no read: `refresh_node` and
    `_refresh_provider` keep it true in the transaction that changes a price or the node's
    GPUs, and a claim has the node's row already. Spot reads the provider's prices: the
    discount is per model, so the highest spot rate need not be the highest price's."""
    if not spot:
        return node.price_per_gpu_hour_micro or 0
    return await read_rate(session, node, spot=True)


async def read_rate(session: AsyncSession, node: NodeRow, *, spot: bool) -> int:
    """The rate read from the provider's prices now: what `hourly_rate` means, and what
    the node's denormalised on-demand rate is kept equal to."""
    tx = await driver_of(session)
    rows = await tx.fetch(_PRICES_OF_PROVIDER, provider=node.provider_id)
    rates = [
        Rate(
            row["provider_id"],
            row["gpu_model"],
            row["price_micro_per_hour"],
            row["spot_discount_bps"],
        )
        for row in rows
    ]
    return _rate(node, rates, spot=spot)


def on_demand_rates(nodes: Sequence[NodeRow]) -> dict[str, int]:
    """`hourly_rate(…, spot=False)` of each node by id (a submit weighs every online node
    that could take the job): their denormalised rates, no read."""
    return {node.id: node.price_per_gpu_hour_micro or 0 for node in nodes}


async def refresh_node(session: AsyncSession, node: NodeRow) -> None:
    """Keep the node's denormalised on-demand rate true (None: no price set for it)."""
    node.price_per_gpu_hour_micro = await read_rate(session, node, spot=False) or None


async def _nodes_of(session: AsyncSession, provider_id: str) -> list[NodeRow]:
    query = select(NodeRow).where(NodeRow.provider_id == provider_id).order_by(NodeRow.id)
    return list((await session.scalars(query)).all())


async def _prices_of(session: AsyncSession, provider_id: str) -> list[ProviderPriceRow]:
    query = (
        select(ProviderPriceRow)
        .where(ProviderPriceRow.provider_id == provider_id)
        .order_by(ProviderPriceRow.gpu_model)
    )
    return list((await session.scalars(query)).all())


async def _refresh_provider(session: AsyncSession, provider_id: str) -> None:
    prices = await _prices_of(session, provider_id)
    for node in await _nodes_of(session, provider_id):
        node.price_per_gpu_hour_micro = _rate(node, prices, spot=False) or None


async def machines_by_model(session: AsyncSession, provider_id: str) -> Counter[str]:
    """How many of the provider's machines run each model ("cpu" for CPU nodes)."""
    nodes = await _nodes_of(session, provider_id)
    return Counter(model for node in nodes for model in models_of(node))


def to_wire(row: ProviderPriceRow, machines: int) -> Price:
    return Price(
        gpu_model=row.gpu_model,
        price_per_gpu_hour=usdc_text(row.price_micro_per_hour),
        spot_discount_pct=row.spot_discount_bps // 100,
        spot_price_per_gpu_hour=usdc_text(
            spot_rate(row.price_micro_per_hour, row.spot_discount_bps)
        ),
        machines=machines,
        updated_at=row.updated_at,
    )


async def list_prices(session: AsyncSession, provider_id: str) -> ProviderPrices:
    machines = await machines_by_model(session, provider_id)
    rows = await _prices_of(session, provider_id)
    priced = {row.gpu_model for row in rows}
    return ProviderPrices(
        prices=[to_wire(row, machines.get(row.gpu_model, 0)) for row in rows],
        unpriced_models=sorted(m for m in machines if m not in priced),
    )


def _canonical(gpu_model: str, known: Iterable[str]) -> str | None:
    """The model as the agents name it, matched regardless of case and spacing."""
    wanted = " ".join(gpu_model.split()).casefold()
    return next((m for m in known if " ".join(m.split()).casefold() == wanted), None)


async def set_price(
    session: AsyncSession, provider_id: str, gpu_model: str, update: PriceUpdate, now: datetime
) -> Price:
    """Set (or change) the provider's price for a model one of their machines runs, or
    for "cpu"; their nodes' rates follow at once, for work placed from now on."""
    machines = await machines_by_model(session, provider_id)
    model = _canonical(gpu_model, [*machines, CPU_MODEL])
    if model is None:
        runs = ", ".join(f'"{m}"' for m in sorted(machines)) or "no machine yet"
        raise ValidationFailed(
            f'gpu_model: none of your machines runs "{gpu_model}"; set a price for a model '
            f'your machines run ({runs}) or for "{CPU_MODEL}"',
            details=[{"loc": ["path", "gpu_model"], "msg": "not a model your machines run"}],
        )
    row = await session.get(ProviderPriceRow, (provider_id, model))
    if row is None:
        row = ProviderPriceRow(provider_id=provider_id, gpu_model=model)
        session.add(row)
    row.price_micro_per_hour = update.price_per_gpu_hour
    row.spot_discount_bps = update.spot_discount_pct * 100
    row.updated_at = now
    await session.flush()
    await _refresh_provider(session, provider_id)
    return to_wire(row, machines.get(model, 0))


async def remove_price(session: AsyncSession, provider_id: str, gpu_model: str) -> None:
    """Remove a price; the model's machines are listed without one for new work."""
    rows = await _prices_of(session, provider_id)
    model = _canonical(gpu_model, [row.gpu_model for row in rows])
    row = next((r for r in rows if r.gpu_model == model), None)
    if row is None:
        raise NotFound(f'you have no price set for "{gpu_model}"')
    await session.delete(row)
    await session.flush()
    await _refresh_provider(session, provider_id)
