"""What a caught node costs, and whom (docs/trust.md, "When a node is caught").

`catch` runs in the transaction that records the confirmed mismatch, so the verdict
never stands without its consequences nor they without it, and a retried pass finds
the check concluded and does nothing twice:

1. the node is quarantined (no new work, out of the offers; its running jobs are
   requeued elsewhere and whatever it reports for them refused; its sessions are ended
   with NODE_QUARANTINED by the replica that holds them, `sessions.upkeep`);
2. an incident records the evidence (both results, the inputs' hashes, both verdicts);
3. the tenant gets the trusted node's result (`invoke_state.replace_result`);
4. every charge of the node still in its hold is refunded to its tenant (`refund_held`:
   invokes, sessions, reservations alike), the checked job's among them;
5. the provider's held earnings that are left, of all their nodes, are forfeited to the
   platform: what the refunds could not take from the node's own earnings (the
   commission the platform gives back) is covered from them;
6. the provider is mailed (outbox, cause ``trust:<incident>:caught``), and its offences
   count up; at the second the provider is suspended and all its nodes quarantined.

A node caught again while already quarantined (another of its checks coming back) adds
an incident with its evidence and the tenant's result, not an offence. The refunds are
also a standing rule, not one pass: `refund_quarantined` refunds whatever a quarantined
node was still charged (a session billed to its end), so no tenant pays a quarantined
node for work within the hold, whatever the order things happen in.
"""

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.errors import Conflict, NotFound
from gpu_share.coordinator.core.ids import new_id
from gpu_share.coordinator.core.orm import (
    EarningsHoldRow,
    InvokeRow,
    NodeRow,
    ProviderRow,
    TrustIncidentRow,
)
from gpu_share.coordinator.core.statuses import ACTIVE_VALUES
from gpu_share.coordinator.services.mail import outbox
from gpu_share.coordinator.services.money import clawbacks
from gpu_share.coordinator.services.trust import incident_mails
from gpu_share.coordinator.services.work import invoke_state
from gpu_share.coordinator.services.work.invoke_state import Lease
from gpu_share.protocol.invokes import InvokeStatus

log = logging.getLogger(__name__)

SUSPEND_AT = 2  # offences
REFUND_REASON = "its node was caught returning wrong results (docs/trust.md)"


class IncidentKind:
    RESULT_MISMATCH = "result_mismatch"  # outputs that differ from the trusted node's
    FAILURE_NOT_REPRODUCED = "failure_not_reproduced"  # a failure the trusted node ran


def forfeit_cause(incident_id: str) -> str:
    return f"trust:{incident_id}:forfeit"


@dataclass(frozen=True)
class Caught:
    incident_id: str
    quarantined: list[str]  # nodes quarantined by this catch (none if it already was)
    refunded_micro: int
    forfeited_micro: int
    suspended: bool


async def catch(
    session: AsyncSession,
    *,
    checked: InvokeRow,
    check: InvokeRow,
    kind: str,
    evidence: dict[str, Any],
    now: datetime,
    base_url: str,
) -> Caught:
    """Everything a confirmed mismatch of `checked` (run on its node) against `check` (on a
    trusted node) sets off, in the caller's transaction (module doc)."""
    assert checked.node_id is not None
    node = await _locked(session, NodeRow, checked.node_id)
    provider = await _locked(session, ProviderRow, node.provider_id)
    incident = TrustIncidentRow(
        id=new_id("inc"),
        node_id=node.id,
        provider_id=provider.id,
        kind=kind,
        invoke_id=checked.id,
        check_invoke_id=check.id,
        evidence=evidence,
        refunded_micro=0,
        forfeited_micro=0,
        created_at=now,
    )
    session.add(incident)
    await session.flush()
    first = node.quarantined_at is None
    quarantined: list[str] = []
    if first:
        await quarantine(session, node, f"caught by a spot check: incident {incident.id}", now)
        quarantined.append(node.id)
    if check.result is not None and check.status == InvokeStatus.DONE.value:
        await invoke_state.replace_result(session, checked.id, check.result)
    suspended = False
    if first:
        provider.offences = (provider.offences or 0) + 1
        if provider.offences >= SUSPEND_AT and provider.suspended_at is None:
            provider.suspended_at = now
            suspended = True
            quarantined += await _quarantine_all(session, provider.id, incident.id, now)
    refunded = 0
    for node_id in [node.id, *[n for n in quarantined if n != node.id]]:
        refunded += await refund_held(session, node_id, now)
    incident.refunded_micro = refunded
    incident.forfeited_micro = await clawbacks.forfeit_held(
        session,
        provider.id,
        None,
        forfeit_cause(incident.id),
        now,
        reason=f"incident {incident.id}: {kind}",
    )
    if first:
        await outbox.enqueue(
            session,
            incident_mails.cause(incident.id),
            incident_mails.caught(provider, node, incident, suspended=suspended, base_url=base_url),
            now,
        )
    log.warning(
        "trust: node %s caught (%s), incident %s: refunded %d, forfeited %d%s",
        node.id,
        kind,
        incident.id,
        incident.refunded_micro,
        incident.forfeited_micro,
        ", provider suspended" if suspended else "",
    )
    return Caught(
        incident.id, quarantined, incident.refunded_micro, incident.forfeited_micro, suspended
    )


Row = TypeVar("Row", NodeRow, ProviderRow)


async def _locked(session: AsyncSession, table: type[Row], row_id: str) -> Row:
    row = await session.scalar(
        select(table).where(table.id == row_id).with_for_update(),
        execution_options={"populate_existing": True},
    )
    if row is None:
        raise NotFound(f"{table.__tablename__} {row_id} does not exist")
    return row


async def quarantine(session: AsyncSession, node: NodeRow, reason: str, now: datetime) -> None:
    """No new work from now (`placement.node_listed`), and the work it holds is requeued:
    its leases end here, so what it reports for them is refused as stale."""
    node.quarantined_at = now
    node.quarantine_reason = reason
    node.polling_until = None
    held = (
        await session.execute(
            select(InvokeRow.id, InvokeRow.lease_token).where(
                InvokeRow.node_id == node.id, InvokeRow.status.in_(ACTIVE_VALUES)
            )
        )
    ).all()
    for invoke_id, token in held:
        if token is not None:
            await invoke_state.requeue(session, Lease(invoke_id, node.id, token))


async def _quarantine_all(
    session: AsyncSession, provider_id: str, incident_id: str, now: datetime
) -> list[str]:
    nodes = (
        await session.scalars(
            select(NodeRow)
            .where(NodeRow.provider_id == provider_id, NodeRow.quarantined_at.is_(None))
            .with_for_update()
        )
    ).all()
    for node in nodes:
        await quarantine(session, node, f"its provider is suspended (incident {incident_id})", now)
    return [node.id for node in nodes]


async def refund_held(session: AsyncSession, node_id: str, now: datetime) -> int:
    """Refund every charge of the node still in its hold; returns what the tenants got
    back. The invokes refunded say so (`refunded_at`, `refund_reason`)."""
    total = 0
    invokes: list[str] = []
    for charge in await clawbacks.held_charges(session, node_id):
        try:
            back = await clawbacks.refund_charge(session, charge.charge_id, REFUND_REASON, now)
        except (Conflict, NotFound):  # released meanwhile: payable, no longer ours to take
            continue
        total += back
        if charge.work == "invoke" and charge.work_id:
            invokes.append(charge.work_id)
    if invokes:
        await session.execute(
            update(InvokeRow)
            .where(InvokeRow.id.in_(invokes), InvokeRow.refunded_at.is_(None))
            .values(refunded_at=now, refund_reason=REFUND_REASON)
        )
    return total


async def refund_quarantined(session: AsyncSession, now: datetime) -> int:
    """Refund what quarantined nodes were charged since their last refunds, adding it to
    their latest incident (or their provider's); returns the sum."""
    node_ids = (
        await session.scalars(
            select(EarningsHoldRow.node_id)
            .join(NodeRow, NodeRow.id == EarningsHoldRow.node_id)
            .where(NodeRow.quarantined_at.is_not(None))
            .distinct()
        )
    ).all()
    total = 0
    for node_id in node_ids:
        back = await refund_held(session, node_id, now)
        if back:
            total += back
            await _add_to_incident(session, node_id, back)
    return total


async def _add_to_incident(session: AsyncSession, node_id: str, refunded: int) -> None:
    node = await session.get(NodeRow, node_id)
    if node is None:
        return
    latest = await session.scalar(
        select(TrustIncidentRow)
        .where(
            (TrustIncidentRow.node_id == node_id)
            | (TrustIncidentRow.provider_id == node.provider_id)
        )
        .order_by((TrustIncidentRow.node_id == node_id).desc(), TrustIncidentRow.created_at.desc())
        .limit(1)
    )
    if latest is not None:
        latest.refunded_micro += refunded
