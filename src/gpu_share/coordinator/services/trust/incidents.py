"""Trust incidents as admins and providers read them (docs/trust.md, "When a node is
caught"), and the admin's mark of trusted nodes. Admins see the evidence; providers
see what their node did and what it cost, never the tenant's job or data."""

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.errors import NotFound
from gpu_share.coordinator.core.orm import NodeRow, TrustIncidentRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.nodes.trusted import TrustRule, is_trusted
from gpu_share.protocol.incidents import NodeTrust, TrustIncident
from gpu_share.protocol.money import usdc_text

LIST_LIMIT = 200


def to_wire(row: TrustIncidentRow, *, evidence: bool) -> TrustIncident:
    return TrustIncident(
        id=row.id,
        node_id=row.node_id,
        provider_id=row.provider_id,
        kind=row.kind,
        reason=str((row.evidence or {}).get("reason", "")),
        invoke_id=row.invoke_id,
        check_invoke_id=row.check_invoke_id,
        refunded=usdc_text(row.refunded_micro),
        forfeited=usdc_text(row.forfeited_micro),
        created_at=row.created_at,
        evidence=row.evidence if evidence else None,
    )


async def listed(
    session: AsyncSession,
    *,
    provider_id: str | None = None,
    node_id: str | None = None,
    limit: int = LIST_LIMIT,
) -> list[TrustIncident]:
    """Latest first; a provider's own (without evidence) when `provider_id` is given."""
    query = select(TrustIncidentRow).order_by(
        TrustIncidentRow.created_at.desc(), TrustIncidentRow.id.desc()
    )
    if provider_id is not None:
        query = query.where(TrustIncidentRow.provider_id == provider_id)
    if node_id is not None:
        query = query.where(TrustIncidentRow.node_id == node_id)
    rows = (await session.scalars(query.limit(limit))).all()
    return [to_wire(row, evidence=provider_id is None) for row in rows]


async def get(session: AsyncSession, incident_id: str) -> TrustIncident:
    row = await session.get(TrustIncidentRow, incident_id)
    if row is None:
        raise NotFound(f"incident {incident_id} does not exist")
    return to_wire(row, evidence=True)


def node_trust(node: NodeRow, settings: Settings) -> NodeTrust:
    record = node.spot_checks or {}
    trusted = is_trusted(node, TrustRule.of(settings))
    rate = record.get("rate")
    return NodeTrust(
        node_id=node.id,
        marked_trusted=node.trusted,
        trusted=trusted,
        quarantined_at=node.quarantined_at,
        spot_check_rate=None if trusted or not isinstance(rate, int | float) else float(rate),
        spot_checks=record,
    )


async def node_trusts(session: AsyncSession, settings: Settings) -> dict[str, NodeTrust]:
    """Every node's, for the admin's pages."""
    rows = (await session.scalars(select(NodeRow))).all()
    return {row.id: node_trust(row, settings) for row in rows}


async def mark_trusted(
    session: AsyncSession, node_id: str, trusted: bool, settings: Settings
) -> NodeTrust:
    """An admin's mark: the node takes other nodes' spot checks (the platform's own
    machines), or no longer does. A quarantined node keeps its mark but takes none."""
    node = await session.get(NodeRow, node_id, with_for_update=True)
    if node is None:
        raise NotFound(f"node {node_id} does not exist")
    node.trusted = trusted
    return node_trust(node, settings)
