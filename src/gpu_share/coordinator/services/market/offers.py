"""The marketplace (SPEC §4.2): online, listed nodes inside their windows, as offers,
filtered and sorted; each with the scores placement uses and their components.

Only verified nodes (`placement.node_verified`: all their hardware proven, docs/trust.md)
are offered unless the query asks for the others too; those are marked, and their GPUs
are matched as they claim to be, since showing them is all an offer does."""

from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.nodes import nodes, proofs, ranking
from gpu_share.coordinator.services.nodes.placement import (
    Requirements,
    gpu_verified,
    listed_gpu,
    node_status,
    node_verified,
    reliability_of,
    serves,
    stored_reliability,
    verified_at,
)
from gpu_share.coordinator.services.work import gpu_assignment, reservation_holds
from gpu_share.protocol.money import MICRO
from gpu_share.protocol.nodes import GpuTopology, SandboxKind, Tier
from gpu_share.protocol.offers import Offer, OfferGpus, OfferQuery, OfferSort
from gpu_share.protocol.runtimes import RuntimeName


def _requirements(query: OfferQuery, runtime: RuntimeName) -> Requirements:
    return Requirements(
        runtime=runtime,
        gpus=query.gpus if runtime.needs_gpu else 1,
        min_vram_mb=int(query.min_vram_gb * 1000**3 / 1024**2) if query.min_vram_gb else None,
        gpu_model=query.gpu_model,
        region=query.region,
        tier=query.tier.value if query.tier else None,
        max_price_micro=int(query.max_price * MICRO) if query.max_price is not None else None,
        min_reliability=query.min_reliability,
        # Shown with their unverified hardware, nodes are matched as they claim to be.
        verified_gpus=False if query.include_unverified else None,
    )


def matches(node: NodeRow, query: OfferQuery, now: datetime) -> bool:
    """The node serves some runtime asked for (the one named, or any) under the filters,
    and is verified unless the query includes unverified nodes."""
    if not query.include_unverified and not node_verified(node):
        return False
    runtimes = [query.runtime] if query.runtime else [RuntimeName(r) for r in nodes.known(node)]
    wants_gpus = query.gpu_model or query.min_vram_gb or query.gpus > 1 or query.nvlink
    if query.nvlink is not None and gpu_assignment.nvlinked(node, query.gpus) != query.nvlink:
        return False
    return any(
        serves(node, _requirements(query, runtime), now)
        for runtime in runtimes
        if runtime.needs_gpu or not wants_gpus
    )


def _gpus(node: NodeRow) -> list[OfferGpus]:
    groups: dict[tuple[str, bool], list[dict[str, Any]]] = {}
    for gpu in node.gpus:
        if listed_gpu(node, gpu):
            key = (str(gpu.get("model", "")), gpu_verified(node, gpu))
            groups.setdefault(key, []).append(gpu)
    offers = []
    for (model, verified), gpus in groups.items():
        scores = [s for g in gpus if (s := nodes.gpu_benchmark_score(node, g)) is not None]
        cuda = gpus[0].get("cuda_version")
        offers.append(
            OfferGpus(
                model=model,
                count=len(gpus),
                vram_mb=min(int(str(g.get("vram_mb", 0))) for g in gpus),
                cuda_version=str(cuda) if cuda else None,
                benchmark_score=round(sum(scores) / len(scores), 4) if scores else None,
                verified=verified,
            )
        )
    return offers


def _topology(node: NodeRow) -> GpuTopology | None:
    if not node.gpu_topology:
        return None
    try:
        return GpuTopology.model_validate(node.gpu_topology)
    except ValueError:  # stored by an agent of another version: not worth failing the page
        return None


# The agent's default share of the RAM for all jobs (`AgentSettings.job_memory_fraction`).
JOB_MEMORY_FRACTION = 0.75


def job_memory_mb(node: NodeRow) -> int:
    """What each job may use on the node, as its agent reported it; for an agent that did
    not say, the default an agent sets (the slot's share of the RAM, less the system's)."""
    if node.job_memory_mb is not None:
        return node.job_memory_mb
    return int(node.ram_mb * JOB_MEMORY_FRACTION) // max(1, node.max_concurrent_jobs)


def to_offer(node: NodeRow, running: int, now: datetime, settings: Settings) -> Offer:
    gpus = _gpus(node)
    topology = _topology(node)
    return Offer(
        node_id=node.id,
        label=node.label,
        status=node_status(node, now, running, settings.node_offline_after_sec),
        region=node.region,
        tier=Tier(node.tier),
        sandbox=SandboxKind(node.sandbox),
        isolated=SandboxKind(node.sandbox).isolates,
        gpus=gpus,
        gpu_count=sum(g.count for g in gpus),
        runtimes=[RuntimeName(r) for r in nodes.known(node)],
        free_slots=max(0, node.max_concurrent_jobs - running),
        memory_limit_mb=job_memory_mb(node),
        price_per_gpu_hour=nodes.price_text(node.price_per_gpu_hour_micro),
        reliability_score=reliability_of(node),
        reliability=stored_reliability(node.reliability),
        benchmark_score=ranking.benchmark_score(node),
        rank=ranking.rank(node),
        rank_components=ranking.components(node),
        nvlink=topology is not None and topology.nvlink,
        gpu_topology=topology,
        verified=node_verified(node),
        verified_at=verified_at(node),
        spot_check_rate=proofs.spot_check_rate(node),
    )


def _sort_key(sort: OfferSort) -> Callable[[Offer], tuple[float, ...]]:
    def key(offer: Offer) -> tuple[float, ...]:
        price = float(offer.price_per_gpu_hour) if offer.price_per_gpu_hour else 0.0
        match sort:
            case OfferSort.PRICE:
                return (price, -offer.rank)
            case OfferSort.RELIABILITY:
                return (-(offer.reliability_score or 0.0), -offer.rank)
            case OfferSort.BENCHMARK:
                return (-(offer.benchmark_score or 0.0), -offer.rank)
            case OfferSort.VRAM:
                return (-max((g.vram_mb for g in offer.gpus), default=0), -offer.rank)
        return (-offer.rank, price)

    return key


async def search(
    session: AsyncSession, query: OfferQuery, now: datetime, settings: Settings
) -> list[Offer]:
    online = await nodes.live_nodes(session, now, settings)
    running = await nodes.running_counts(session)
    reserved = await reservation_holds.reserved_gpus_by_node(session, now)
    offers = [
        to_offer(node, running.get(node.id, 0), now, settings).model_copy(
            update={"reserved_gpus": reserved.get(node.id, 0)}
        )
        for node in online
        if matches(node, query, now)
    ]
    # Reserved GPUs and those whole-GPU sessions hold are not free: a search for GPUs
    # skips nodes left with too few.
    wants_gpus = (
        query.runtime.needs_gpu if query.runtime else bool(query.gpu_model or query.gpus > 1)
    )
    if wants_gpus:
        held = await gpu_assignment.session_held(session)
        reserved_at = await reservation_holds.reserved_indices_by_node(session, now) if held else {}

        def free(offer: Offer) -> int:
            if offer.node_id not in held:
                return offer.gpu_count - offer.reserved_gpus
            taken = held[offer.node_id] | set(reserved_at.get(offer.node_id, []))
            return offer.gpu_count - len(taken)

        offers = [o for o in offers if free(o) >= query.gpus]
    offers.sort(key=_sort_key(query.sort))
    return offers[: query.limit]
