"""Nodes: registration by agents, heartbeats, and what tenants see of them."""

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Select, delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core import driver_models
from gpu_share.coordinator.core.db import driver_of
from gpu_share.coordinator.core.driver_sql import DriverTx, Row, Sql
from gpu_share.coordinator.core.errors import NotFound
from gpu_share.coordinator.core.ids import new_id
from gpu_share.coordinator.core.orm import InvokeRow, NodeRow, ProviderRow, TelemetrySampleRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.core.statuses import ACTIVE_VALUES
from gpu_share.coordinator.services.accounts.accounts import issue_key, revoke_node_keys
from gpu_share.coordinator.services.nodes import hardware, prices
from gpu_share.coordinator.services.nodes.placement import (
    READS,
    Requirements,
    gpu_proof,
    in_window,
    listed_gpu,
    node_status,
    node_verified,
    proven_at,
    reliability_of,
    serves,
    stored_reliability,
    verified_at,
)
from gpu_share.coordinator.services.nodes.proofs import hardware_proofs, spot_check_rate
from gpu_share.protocol import agent as wire
from gpu_share.protocol.accounts import Role
from gpu_share.protocol.money import usdc_text
from gpu_share.protocol.nodes import (
    GpuInfo,
    Node,
    NodeGpu,
    NodeStatus,
    RuntimeAvailability,
    SandboxKind,
    Telemetry,
    TelemetrySample,
    Tier,
)
from gpu_share.protocol.providers import ProviderNode
from gpu_share.protocol.runtimes import RuntimeName


def _forget_changed_hardware(row: NodeRow, inventory: wire.NodeInventory) -> None:
    """What a hardware challenge proved holds only for the hardware it ran on
    (docs/trust.md): a GPU gone, renamed or on another driver, or a CPU node's other core
    count, loses its verification, and the trust domain challenges it again at once."""
    if not row.verification:
        return
    now = {gpu.uuid: (gpu.model, gpu.driver_version) for gpu in inventory.gpus}
    before = {str(g.get("uuid")): (g.get("model"), g.get("driver_version")) for g in row.gpus}
    same_cpu = not inventory.gpus and row.cpu_count == inventory.cpu_count
    kept = {
        target: proof
        for target, proof in row.verification.items()
        if (same_cpu if target == "cpu" else target in now and before.get(target) == now[target])
    }
    if kept != row.verification:
        row.verification = kept


def _apply_inventory(row: NodeRow, inventory: wire.NodeInventory) -> None:
    _forget_changed_hardware(row, inventory)
    row.hostname = inventory.hostname
    row.agent_version = inventory.agent_version
    row.os = inventory.os
    row.cpu_model = inventory.cpu_model
    row.cpu_count = inventory.cpu_count
    row.ram_mb = inventory.ram_mb
    row.gpus = [gpu.model_dump() for gpu in inventory.gpus]
    row.runtimes = sorted({r.value for r in inventory.runtimes})
    row.sandbox = inventory.sandbox
    row.max_concurrent_jobs = inventory.max_concurrent_jobs
    row.job_memory_mb = inventory.job_memory_mb
    row.gpu_topology = (
        inventory.gpu_topology.model_dump(mode="json") if inventory.gpu_topology else None
    )
    if inventory.region:
        row.region = inventory.region
    if inventory.fingerprint:  # an older agent sends none: the one known is kept
        row.fingerprint = inventory.fingerprint


async def register(
    session: AsyncSession,
    provider: ProviderRow,
    inventory: wire.NodeInventory,
    now: datetime,
    *,
    enrollment_token_id: str | None,
    reliability: dict[str, Any] | None = None,
) -> tuple[NodeRow, str]:
    """A machine seen for the first time (`hardware.holders` found none), with the score it
    starts from (the providers domain decides it)."""
    row = NodeRow(
        id=new_id("nod"),
        provider_id=provider.id,
        tier=provider.tier,
        price_per_gpu_hour_micro=None,
        telemetry=None,
        delisted=False,
        registered_at=now,
        last_seen_at=now,
        region=None,
        enrollment_token_id=enrollment_token_id,
        reliability=reliability,
    )
    _apply_inventory(row, inventory)
    session.add(row)
    await session.flush()
    await prices.refresh_node(session, row)  # the provider may have priced its models
    _, node_key = await issue_key(session, Role.AGENT, now, provider_id=provider.id, node_id=row.id)
    return row, node_key


async def register_again(
    session: AsyncSession,
    row: NodeRow,
    provider: ProviderRow,
    inventory: wire.NodeInventory,
    now: datetime,
    *,
    enrollment_token_id: str | None,
) -> str:
    """A known machine registering again is its node again: the same id, so everything
    kept by node id (its reliability, benchmarks, verification, spot checks, presence,
    history) carries over. The keys its agents held are revoked; a new one is issued."""
    await revoke_node_keys(session, row.id, now)
    _apply_inventory(row, inventory)
    row.tier = provider.tier
    row.last_seen_at = now
    row.enrollment_token_id = enrollment_token_id
    await prices.refresh_node(session, row)
    _, node_key = await issue_key(session, Role.AGENT, now, provider_id=provider.id, node_id=row.id)
    return node_key


async def update_inventory(
    session: AsyncSession, node_id: str, inventory: wire.NodeInventory, now: datetime
) -> NodeRow:
    """What the node has now. Hardware it did not have before is checked as a machine
    registering would be (`hardware.refuse_taken`): a node cannot take in the GPUs or the
    fingerprint of a quarantined node, or of another provider's live one."""
    row = await session.get(NodeRow, node_id)
    if row is None:
        raise NotFound(f"node {node_id} does not exist")
    fingerprint = inventory.fingerprint if inventory.fingerprint != row.fingerprint else None
    uuids = hardware.gpu_uuids(inventory.gpus) - hardware.gpu_uuids(row.gpus)
    if fingerprint or uuids:
        held = await hardware.holders(session, fingerprint, uuids)
        others = [held_row for held_row in held if held_row.id != row.id]
        hardware.refuse_taken(others, row.provider_id, uuids, now)
    _apply_inventory(row, inventory)
    row.last_seen_at = now
    await prices.refresh_node(session, row)  # its GPUs, so its price, may have changed
    return row


async def running_counts(session: AsyncSession) -> dict[str, int]:
    rows = await session.execute(
        select(InvokeRow.node_id, func.count())
        .where(InvokeRow.status.in_(ACTIVE_VALUES), InvokeRow.node_id.is_not(None))
        .group_by(InvokeRow.node_id)
    )
    return {node_id: count for node_id, count in rows.all() if node_id}


def known(row: NodeRow) -> list[RuntimeName]:
    """What the node advertises, leaving out names this coordinator does not know."""
    known = {runtime.value for runtime in RuntimeName}
    return [RuntimeName(r) for r in row.runtimes if r in known]


def price_text(micro: int | None) -> str | None:
    return None if micro is None else usdc_text(micro)


def gpu_benchmark_score(row: NodeRow, gpu: dict[str, Any]) -> float | None:
    verdict = ((row.benchmark_state or {}).get("gpus") or {}).get(str(gpu.get("uuid")))
    return float(verdict["score"]) if isinstance(verdict, dict) and "score" in verdict else None


def to_wire(row: NodeRow, status: NodeStatus, running: int, now: datetime) -> Node:
    return Node(
        id=row.id,
        label=row.label,
        status=status,
        gpus=[
            NodeGpu(
                model=g.get("model", ""),
                vram_mb=int(g.get("vram_mb", 0)),
                driver_version=g.get("driver_version"),
                cuda_version=g.get("cuda_version"),
                benchmark_score=gpu_benchmark_score(row, g),
                listed=listed_gpu(row, g),
                verified=(proof := gpu_proof(row, g)) is not None,
                verified_at=proven_at(proof),
            )
            for g in row.gpus
        ],
        runtimes=known(row),
        region=row.region,
        tier=Tier(row.tier),
        cpu_count=row.cpu_count,
        ram_mb=row.ram_mb,
        price_per_gpu_hour=price_text(row.price_per_gpu_hour_micro),
        reliability_score=reliability_of(row),
        reliability=stored_reliability(row.reliability),
        available_now=in_window(row, now),
        running_jobs=running,
        max_concurrent_jobs=row.max_concurrent_jobs,
        sandbox=SandboxKind(row.sandbox),
        isolated=SandboxKind(row.sandbox).isolates,
        last_seen_at=row.last_seen_at,
        verified=node_verified(row),
        verified_at=verified_at(row),
        spot_check_rate=spot_check_rate(row),
    )


def _suspended_providers() -> Select[str]:
    return select(ProviderRow.id).where(ProviderRow.suspended_at.is_not(None))


async def list_nodes(
    session: AsyncSession,
    now: datetime,
    settings: Settings,
    *,
    include_offline: bool = True,
    include_barred: bool = False,
) -> list[Node]:
    """Nodes as tenants see them. A quarantined node, or one of a suspended provider, is
    left out (docs/trust.md: it is never listed) unless `include_barred` (the admin's)."""
    query = select(NodeRow).order_by(NodeRow.id)
    if not include_barred:
        query = query.where(
            NodeRow.quarantined_at.is_(None), NodeRow.provider_id.not_in(_suspended_providers())
        )
    rows = (await session.scalars(query)).all()
    running = await running_counts(session)
    nodes = []
    for row in rows:
        count = running.get(row.id, 0)
        status = node_status(row, now, count, settings.node_offline_after_sec)
        if include_offline or status in (NodeStatus.ONLINE, NodeStatus.BUSY):
            nodes.append(to_wire(row, status, count, now))
    return nodes


_LIVE_WHERE = (
    "WHERE nodes.last_seen_at >= :live_since AND nodes.provider_id NOT IN"
    " (SELECT id FROM providers WHERE suspended_at IS NOT NULL)"
)
_LIVE = driver_models.whole_row(NodeRow, _LIVE_WHERE)
"""`live_nodes`' statement, for `:live_since`."""
_LIVE_PLACED = driver_models.some_columns(NodeRow, READS, _LIVE_WHERE)
"""`live_for_placement`'s."""


async def live_nodes(session: AsyncSession, now: datetime, settings: Settings) -> list[NodeRow]:
    """Nodes heard from recently, listed or not (placement's `serves` says which serve),
    but for those of a suspended provider: they get no work, whatever their rows say.

    Every submit weighs them all: read on the driver (`driver_models`), as rows in no
    session. A caller that changes a node reads it with `session.get`."""
    rows = await _live_rows(session, now, settings, _LIVE)
    return [driver_models.transient(NodeRow, row) for row in rows]


async def live_for_placement(
    session: AsyncSession, now: datetime, settings: Settings
) -> list[NodeRow]:
    """`live_nodes` in the columns placement reads (`placement.READS`), for a submit,
    which weighs every one: a node's telemetry, topology and spot checks are not decoded.
    Reading any other column of these raises."""
    rows = await _live_rows(session, now, settings, _LIVE_PLACED)
    return [driver_models.partial(NodeRow, row, READS) for row in rows]


async def _live_rows(
    session: AsyncSession, now: datetime, settings: Settings, sql: Sql
) -> list[Row]:
    cutoff = now - timedelta(seconds=settings.node_offline_after_sec)
    return await (await driver_of(session)).fetch(sql, live_since=cutoff)


async def count_online(session: AsyncSession, now: datetime, settings: Settings) -> int:
    cutoff = now - timedelta(seconds=settings.node_offline_after_sec)
    count = await session.scalar(
        select(func.count()).where(
            NodeRow.last_seen_at >= cutoff,
            NodeRow.delisted.is_(False),
            NodeRow.quarantined_at.is_(None),
        )
    )
    return int(count or 0)


async def runtime_availability(
    session: AsyncSession, now: datetime, settings: Settings
) -> list[RuntimeAvailability]:
    nodes = await live_nodes(session, now, settings)
    return [
        RuntimeAvailability(
            name=runtime,
            kind=runtime.kind,
            device=runtime.device,
            nodes_online=sum(1 for n in nodes if serves(n, Requirements(runtime=runtime), now)),
        )
        for runtime in RuntimeName
    ]


TELEMETRY_KEPT = timedelta(hours=1)


_MARK_SEEN = Sql(
    "UPDATE nodes SET last_seen_at = :at, telemetry = :telemetry WHERE id = :node"
    " RETURNING benchmark_requested_at",
    jsons=("telemetry",),
)
_ADD_SAMPLE = Sql(
    "INSERT INTO telemetry_samples (node_id, at, telemetry) VALUES (:node, :at, :telemetry)",
    jsons=("telemetry",),
)


async def record_beat(tx: DriverTx, node_id: str, telemetry: Telemetry, now: datetime) -> bool:
    """Mark the node seen with what it reports, and keep the sample for the live charts;
    whether an admin asked it to benchmark itself. Every node runs this every few seconds:
    two statements on the driver (`driver_sql`)."""
    reported = telemetry.model_dump()
    marked = await tx.fetchrow(_MARK_SEEN, node=node_id, at=now, telemetry=reported)
    if marked is None:
        raise NotFound(f"node {node_id} does not exist")
    await tx.execute(_ADD_SAMPLE, node=node_id, at=now, telemetry=reported)
    return marked["benchmark_requested_at"] is not None


async def recent_telemetry(
    session: AsyncSession, node_ids: list[str], since: datetime
) -> dict[str, list[TelemetrySample]]:
    rows = await session.execute(
        select(TelemetrySampleRow.node_id, TelemetrySampleRow.at, TelemetrySampleRow.telemetry)
        .where(TelemetrySampleRow.node_id.in_(node_ids), TelemetrySampleRow.at >= since)
        .order_by(TelemetrySampleRow.at)
    )
    samples: dict[str, list[TelemetrySample]] = {node_id: [] for node_id in node_ids}
    for node_id, at, data in rows.all():
        samples[node_id].append(
            TelemetrySample(at=at, **Telemetry.model_validate(data).model_dump())
        )
    return samples


async def prune_telemetry(session: AsyncSession, now: datetime) -> None:
    await session.execute(
        delete(TelemetrySampleRow).where(TelemetrySampleRow.at < now - TELEMETRY_KEPT)
    )


async def of_provider(
    session: AsyncSession,
    provider_id: str,
    now: datetime,
    settings: Settings,
    *,
    history: timedelta = timedelta(0),
) -> list[ProviderNode]:
    rows = (
        await session.scalars(
            select(NodeRow).where(NodeRow.provider_id == provider_id).order_by(NodeRow.id)
        )
    ).all()
    running = await running_counts(session)
    recent = (
        await recent_telemetry(session, [row.id for row in rows], now - history)
        if history > timedelta(0) and rows
        else {}
    )
    return [
        _provider_node(row, running.get(row.id, 0), now, settings, recent.get(row.id, []))
        for row in rows
    ]


def _provider_node(
    row: NodeRow,
    running: int,
    now: datetime,
    settings: Settings,
    recent: list[TelemetrySample],
) -> ProviderNode:
    return ProviderNode(
        id=row.id,
        label=row.label,
        hostname=row.hostname,
        status=node_status(row, now, running, settings.node_offline_after_sec),
        gpus=[GpuInfo.model_validate(gpu) for gpu in row.gpus],
        runtimes=known(row),
        sandbox=SandboxKind(row.sandbox),
        region=row.region,
        tier=Tier(row.tier),
        cpu_count=row.cpu_count,
        ram_mb=row.ram_mb,
        agent_version=row.agent_version,
        running_jobs=running,
        max_concurrent_jobs=row.max_concurrent_jobs,
        registered_at=row.registered_at,
        last_seen_at=row.last_seen_at,
        telemetry=Telemetry.model_validate(row.telemetry) if row.telemetry else None,
        recent=recent,
        verified=node_verified(row),
        verification=hardware_proofs(row),
    )


async def set_label(
    session: AsyncSession,
    provider_id: str,
    node_id: str,
    label: str | None,
    now: datetime,
    settings: Settings,
) -> ProviderNode:
    """Name the provider's machine (None: unnamed again); another's node is a 404.

    `label` comes checked (`protocol.names.NodeLabel`). Only the provider sets it: an
    agent re-registering keeps it, as it keeps the schedule.
    """
    row = await session.get(NodeRow, node_id)
    if row is None or row.provider_id != provider_id:
        raise NotFound(f"no node {node_id} of yours")  # another's node is not even confirmed
    row.label = label
    await session.flush()
    running = await running_counts(session)
    return _provider_node(row, running.get(row.id, 0), now, settings, [])
