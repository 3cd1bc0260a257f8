"""What the admin pages read across resources: counts for the overview, and the owners
that lists of nodes and keys name (the wire models carry ids only). Read-only.

A quarantined node (caught returning wrong results, docs/trust.md) is never online
capacity, however recently it was heard from: it gets no work and is never listed, so
it is counted apart (`nodes_quarantined`), never in `nodes_online` nor in the GPUs
offered (`gpus_online`), here and in the health check.
"""

from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, case, func, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.orm import (
    ApiKeyRow,
    NodeRow,
    OutboxMailRow,
    ProviderApplicationRow,
    ProviderRow,
    TenantApplicationRow,
    TenantRow,
)
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.nodes.placement import listed_gpu, node_listed
from gpu_share.protocol.accounts import ApplicationStatus as TenantApplicationStatus
from gpu_share.protocol.nodes import Tier
from gpu_share.protocol.provider_applications import ApplicationStatus


@dataclass(frozen=True)
class Counts:
    applications_pending: int  # waiting for an admin
    applications_info_requested: int  # waiting for the applicant
    tenant_applications_pending: int
    tenants: int
    providers: int
    nodes_online: int  # heard from recently, listed and not quarantined (online or busy)
    nodes_total: int
    nodes_quarantined: int  # caught cheating: never online capacity, whatever they say
    gpus_online: int  # what the online nodes offer: their listed GPUs
    mails_waiting: int
    mails_failed: int  # given up, each with its reason: an admin passes it on by hand


async def _count(session: AsyncSession, *where: object, table: type) -> int:
    query = select(func.count()).select_from(table)
    for condition in where:
        query = query.where(condition)  # type: ignore[arg-type]
    return int(await session.scalar(query) or 0)


async def applications_by_status(session: AsyncSession) -> dict[str, int]:
    """How many provider applications each status holds (a status with none is absent);
    an application counts once its email is confirmed."""
    rows = await session.execute(
        select(ProviderApplicationRow.status, func.count())
        .where(ProviderApplicationRow.email_confirmed_at.is_not(None))
        .group_by(ProviderApplicationRow.status)
    )
    return {status: int(count) for status, count in rows.all()}


def online(now: datetime, settings: Settings) -> ColumnElement[bool]:
    """The nodes that count as online capacity: heard from recently, not delisted by an
    admin, not quarantined."""
    cutoff = now - timedelta(seconds=settings.node_offline_after_sec)
    return (
        (NodeRow.last_seen_at >= cutoff)
        & NodeRow.delisted.is_(False)
        & NodeRow.quarantined_at.is_(None)
    )


async def nodes_online(session: AsyncSession, now: datetime, settings: Settings) -> int:
    return await _count(session, online(now, settings), table=NodeRow)


@dataclass(frozen=True, slots=True)
class OnlineNode:
    """An online node as the counts read it: its tier and what placement's listing and
    proofs read (`placement.Hardware`), no ORM object (10,000 of them took a scrape of
    /metrics 0.3-0.5 s of the event loop's CPU)."""

    tier: str
    delisted: bool
    quarantined_at: datetime | None
    benchmark_state: dict[str, Any] | None
    verification: dict[str, Any] | None
    gpus: list[Any]
    cpu_count: int

    @property
    def listed_gpus(self) -> int:
        """Its GPUs whose benchmark has not failed (placement's rule)."""
        return sum(1 for gpu in self.gpus or [] if listed_gpu(self, gpu))


async def listed_online_nodes(
    session: AsyncSession, now: datetime, settings: Settings
) -> list[OnlineNode]:
    """The online nodes that are listed (`placement.node_listed`)."""
    rows = await session.execute(
        select(*(getattr(NodeRow, field.name) for field in fields(OnlineNode))).where(
            online(now, settings)
        )
    )
    return [node for node in (OnlineNode(*row) for row in rows.all()) if node_listed(node)]


async def gpus_online(session: AsyncSession, now: datetime, settings: Settings) -> int:
    """The GPUs the online nodes offer: each listed node's GPUs whose benchmark has not
    failed (placement's rules), a quarantined node's never."""
    return sum(node.listed_gpus for node in await listed_online_nodes(session, now, settings))


async def nodes_quarantined(session: AsyncSession) -> int:
    return await _count(session, NodeRow.quarantined_at.is_not(None), table=NodeRow)


async def counts(session: AsyncSession, now: datetime, settings: Settings) -> Counts:
    by_status = await applications_by_status(session)
    return Counts(
        applications_pending=by_status.get(ApplicationStatus.PENDING.value, 0),
        applications_info_requested=by_status.get(ApplicationStatus.INFO_REQUESTED.value, 0),
        tenant_applications_pending=await _count(
            session,
            TenantApplicationRow.status == TenantApplicationStatus.PENDING.value,
            TenantApplicationRow.email_confirmed_at.is_not(None),
            table=TenantApplicationRow,
        ),
        tenants=await _count(session, table=TenantRow),
        providers=await _count(session, table=ProviderRow),
        nodes_online=await nodes_online(session, now, settings),
        nodes_total=await _count(session, table=NodeRow),
        nodes_quarantined=await nodes_quarantined(session),
        gpus_online=await gpus_online(session, now, settings),
        mails_waiting=await mails_waiting(session),
        mails_failed=await mails_failed(session),
    )


async def mails_waiting(session: AsyncSession) -> int:
    """Not sent yet and still tried (a mail given up is counted by `mails_failed`)."""
    return await _count(
        session,
        OutboxMailRow.sent_at.is_(None),
        OutboxMailRow.failed_at.is_(None),
        table=OutboxMailRow,
    )


async def mails_failed(session: AsyncSession) -> int:
    return await _count(session, OutboxMailRow.failed_at.is_not(None), table=OutboxMailRow)


@dataclass(frozen=True)
class ProviderSummary:
    """A provider as admins follow it: has the applicant claimed the account yet?"""

    id: str
    name: str
    email: str
    tier: Tier
    created_at: datetime
    claimed_at: datetime | None
    claim_expires_at: datetime | None  # None: made by an admin with its key, nothing to claim
    nodes: int
    nodes_online: int

    def claim_state(self, now: datetime) -> str:
        if self.claimed_at is not None:
            return "claimed"
        if self.claim_expires_at is None:
            return "issued directly"
        return "waiting" if self.claim_expires_at > now else "expired"


async def provider_summaries(
    session: AsyncSession, now: datetime, settings: Settings
) -> list[ProviderSummary]:
    is_online = online(now, settings)
    node_counts = {
        provider_id: (int(total), int(up or 0))
        for provider_id, total, up in (
            await session.execute(
                select(
                    NodeRow.provider_id,
                    func.count(),
                    func.sum(case((is_online, 1), else_=0)),
                ).group_by(NodeRow.provider_id)
            )
        ).all()
    }
    rows = (await session.scalars(select(ProviderRow).order_by(ProviderRow.id.desc()))).all()
    return [
        ProviderSummary(
            id=row.id,
            name=row.name,
            email=row.email,
            tier=Tier(row.tier),
            created_at=row.created_at,
            claimed_at=row.claimed_at,
            claim_expires_at=row.claim_expires_at,
            nodes=node_counts.get(row.id, (0, 0))[0],
            nodes_online=node_counts.get(row.id, (0, 0))[1],
        )
        for row in rows
    ]


@dataclass(frozen=True)
class NodeOwner:
    hostname: str
    agent_version: str
    provider_id: str
    provider_name: str
    label: str | None = None

    @property
    def name(self) -> str:
        """What pages call the machine: its provider's label, else its hostname."""
        return self.label or self.hostname


async def node_owners(session: AsyncSession) -> dict[str, NodeOwner]:
    rows = await session.execute(
        select(
            NodeRow.id,
            NodeRow.hostname,
            NodeRow.agent_version,
            ProviderRow.id,
            ProviderRow.name,
            NodeRow.label,
        ).join(ProviderRow, ProviderRow.id == NodeRow.provider_id)
    )
    return {
        node_id: NodeOwner(hostname, version, provider_id, provider_name, label)
        for node_id, hostname, version, provider_id, provider_name, label in rows.all()
    }


async def key_owners(session: AsyncSession) -> dict[str, str]:
    """Each key's owner in words: the tenant's or provider's name, and a node's name (its
    provider's label, else its hostname)."""
    rows = await session.execute(
        select(
            ApiKeyRow.id,
            TenantRow.name,
            ProviderRow.name,
            func.coalesce(NodeRow.label, NodeRow.hostname),
        )
        .outerjoin(TenantRow, TenantRow.id == ApiKeyRow.tenant_id)
        .outerjoin(ProviderRow, ProviderRow.id == ApiKeyRow.provider_id)
        .outerjoin(NodeRow, NodeRow.id == ApiKeyRow.node_id)
    )
    owners = {}
    for key_id, tenant, provider, host in rows.all():
        parts = [name for name in (tenant, provider, host) if name]
        owners[key_id] = " · ".join(parts) if parts else "the platform"
    return owners


async def tenant_names(session: AsyncSession) -> dict[str, str]:
    rows = await session.execute(select(TenantRow.id, TenantRow.name).order_by(TenantRow.name))
    return dict(rows.all())
