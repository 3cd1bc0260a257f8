"""Price recommendations (SPEC §3.4): what other providers charge for the same GPU model,
weighted by how much their machines are used (docs/pricing.md).

An offer is another provider's machine, heard from within the window and not delisted,
with listed GPUs of the model and a price set for it. Its weight is its GPUs of the
model × (IDLE_WEIGHT + its utilization over the window), so a price that sells counts
up to 11 times one that sits idle, and a large machine counts as the supply it is.
Utilization comes from the jobs and sessions that ran on the machine, not from
telemetry samples: those are kept for an hour only, and a week says more about demand
than an hour does.

The suggestion is the weighted median of the offers' prices, the range their weighted
25th to 75th percentiles; each is one of the prices offered, so no figure is invented.
With too few offers in the machine's region, every region is compared; with none at
all, there is no recommendation and the answer says so.
"""

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import and_, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.orm import InvokeRow, NodeRow, ProviderPriceRow, SessionRow
from gpu_share.coordinator.core.statuses import ACTIVE_VALUES, OPEN_SESSION_VALUES
from gpu_share.coordinator.services.nodes.placement import listed_gpu, node_listed
from gpu_share.coordinator.services.nodes.prices import CPU_MODEL, models_of
from gpu_share.protocol.money import usdc_text
from gpu_share.protocol.prices import ComparedIn, Recommendation

WINDOW = timedelta(days=7)
MIN_REGIONAL_OFFERS = 3  # fewer in the region: compare across all regions
IDLE_WEIGHT = 0.1  # an idle offer still counts, a tenth of a fully used one
MIN_SPAN = timedelta(hours=1)  # a machine newer than this is measured over an hour


@dataclass(frozen=True)
class Offer:
    node_id: str
    provider_id: str
    gpu_model: str
    region: str | None
    gpus: int  # listed GPUs of the model; 1 for a CPU node
    price_micro: int  # per GPU-hour, on demand
    utilization: float  # 0..1 over the window

    @property
    def weight(self) -> float:
        return self.gpus * (IDLE_WEIGHT + self.utilization)


def weighted_quantile(points: Sequence[tuple[int, float]], q: float) -> int:
    """The lowest price at or below which at least `q` of the weight lies."""
    ordered = sorted(points)
    total = math.fsum(w for _, w in ordered)
    target = q * total
    running = 0.0
    for price, weight in ordered:
        running += weight
        if running >= target - 1e-9 * total:
            return price
    return ordered[-1][0]


def percentile_of(price: int, points: Sequence[tuple[int, float]]) -> int:
    """Share (0–100) of the weight priced below `price`, ties counted half."""
    total = math.fsum(w for _, w in points)
    below = math.fsum(w for p, w in points if p < price)
    equal = math.fsum(w for p, w in points if p == price)
    return round(100 * (below + equal / 2) / total)


def _gpus_of(node: NodeRow, model: str) -> int:
    if model == CPU_MODEL:
        return 0 if node.gpus else 1
    return sum(1 for g in node.gpus if g.get("model") == model and listed_gpu(node, g))


def _capacity(node: NodeRow) -> int:
    """What utilization is a share of: the node's GPUs, or a CPU node's job slots."""
    return len(node.gpus) or max(1, node.max_concurrent_jobs)


async def _work_seconds(
    session: AsyncSession, node_ids: set[str], since: datetime, now: datetime
) -> dict[str, float]:
    """Per node, the seconds × GPUs of work (jobs and sessions) inside [since, now]; a job
    that asked for no GPU counts as one unit."""
    busy: dict[str, float] = defaultdict(float)

    def add(node_id: str | None, start: datetime | None, end: datetime | None, units: int) -> None:
        if node_id not in node_ids or start is None:
            return
        seconds = (min(end or now, now) - max(start, since)).total_seconds()
        if seconds > 0:
            busy[node_id] += seconds * max(1, units)

    invokes = await session.execute(
        select(InvokeRow.node_id, InvokeRow.started_at, InvokeRow.finished_at, InvokeRow.gpus)
        .where(InvokeRow.started_at.is_not(None), InvokeRow.started_at < now)
        .where(
            or_(
                InvokeRow.finished_at >= since,
                and_(InvokeRow.finished_at.is_(None), InvokeRow.status.in_(ACTIVE_VALUES)),
            )
        )
    )
    for node_id, started, finished, gpus in invokes.all():
        add(node_id, started, finished, gpus)
    sessions = await session.execute(
        select(SessionRow.node_id, SessionRow.ready_at, SessionRow.closed_at)
        .where(SessionRow.ready_at.is_not(None), SessionRow.ready_at < now)
        .where(
            or_(
                SessionRow.closed_at >= since,
                and_(SessionRow.closed_at.is_(None), SessionRow.status.in_(OPEN_SESSION_VALUES)),
            )
        )
    )
    for node_id, ready, closed in sessions.all():
        add(node_id, ready, closed, 1)
    return busy


async def market(session: AsyncSession, models: Iterable[str], now: datetime) -> list[Offer]:
    """Every provider's current offers of these models (priced, listed, recently heard from)."""
    wanted = set(models)
    if not wanted:
        return []
    since = now - WINDOW
    price_rows = (
        await session.scalars(
            select(ProviderPriceRow).where(ProviderPriceRow.gpu_model.in_(wanted))
        )
    ).all()
    prices = {(r.provider_id, r.gpu_model): r.price_micro_per_hour for r in price_rows}
    providers = {provider_id for provider_id, _ in prices}
    if not providers:
        return []
    nodes = (
        await session.scalars(
            select(NodeRow).where(NodeRow.provider_id.in_(providers), NodeRow.last_seen_at >= since)
        )
    ).all()
    listed = [node for node in nodes if node_listed(node)]
    busy = await _work_seconds(session, {node.id for node in listed}, since, now)
    offers = []
    for node in listed:
        span = max(now - max(since, node.registered_at), MIN_SPAN).total_seconds()
        utilization = min(1.0, busy.get(node.id, 0.0) / (span * _capacity(node)))
        for model in models_of(node):
            price = prices.get((node.provider_id, model))
            gpus = _gpus_of(node, model)
            if model in wanted and price is not None and gpus > 0:
                offers.append(
                    Offer(node.id, node.provider_id, model, node.region, gpus, price, utilization)
                )
    return offers


def recommend(
    model: str, region: str | None, offers: Sequence[Offer], own_price: int | None
) -> Recommendation:
    """The recommendation for one model in one region, from other providers' offers."""
    same = [o for o in offers if region is not None and o.region == region]
    regional = len(same) >= MIN_REGIONAL_OFFERS
    compared = same if regional else list(offers)
    where = f"in {region}" if regional else "across all regions"
    base = Recommendation(
        gpu_model=model,
        region=region,
        compared_in=ComparedIn.REGION if regional else ComparedIn.ALL_REGIONS,
        comparable_offers=len(compared),
        comparable_gpus=sum(o.gpus for o in compared),
        market_utilization=None,
        suggested_price_per_gpu_hour=None,
        range_low=None,
        range_high=None,
        your_price_per_gpu_hour=usdc_text(own_price) if own_price is not None else None,
        your_percentile=None,
        window_days=WINDOW.days,
        basis=(
            f"No other provider offers {model} with a price yet, in any region: there is "
            "nothing to compare with, so there is no recommendation."
        ),
    )
    if not compared:
        return base
    points = [(o.price_micro, o.weight) for o in compared]
    gpus = sum(o.gpus for o in compared)
    machines = "machine" if len(compared) == 1 else "machines"
    fallback = (
        "" if regional or region is None else f" (fewer than {MIN_REGIONAL_OFFERS} in {region})"
    )
    return base.model_copy(
        update={
            "market_utilization": round(sum(o.gpus * o.utilization for o in compared) / gpus, 4),
            "suggested_price_per_gpu_hour": usdc_text(weighted_quantile(points, 0.5)),
            "range_low": usdc_text(weighted_quantile(points, 0.25)),
            "range_high": usdc_text(weighted_quantile(points, 0.75)),
            "your_percentile": percentile_of(own_price, points) if own_price is not None else None,
            "basis": (
                f"{len(compared)} priced {machines} of other providers {where}{fallback}, "
                f"weighted by their size and by how much each was used over the last "
                f"{WINDOW.days} days."
            ),
        }
    )


async def for_provider(
    session: AsyncSession, provider_id: str, now: datetime
) -> list[Recommendation]:
    """One recommendation per GPU model and region of the provider's machines."""
    own_nodes = (
        await session.scalars(select(NodeRow).where(NodeRow.provider_id == provider_id))
    ).all()
    pairs = sorted(
        {(model, node.region) for node in own_nodes for model in models_of(node)},
        key=lambda pair: (pair[0], pair[1] is None, pair[1] or ""),
    )
    if not pairs:
        return []
    own_prices = {
        r.gpu_model: r.price_micro_per_hour
        for r in (
            await session.scalars(
                select(ProviderPriceRow).where(ProviderPriceRow.provider_id == provider_id)
            )
        ).all()
    }
    offers = await market(session, {model for model, _ in pairs}, now)
    by_model: dict[str, list[Offer]] = defaultdict(list)
    for offer in offers:
        if offer.provider_id != provider_id:  # one's own prices are no evidence of a market
            by_model[offer.gpu_model].append(offer)
    return [
        recommend(model, region, by_model[model], own_prices.get(model)) for model, region in pairs
    ]
