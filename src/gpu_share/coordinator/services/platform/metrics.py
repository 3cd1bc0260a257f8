"""What `/metrics` reads from the database at each scrape (`core.metrics.Reading`s): the
state every replica shares, so each answers the same. Counts and sums only, each one
statement grouped by its labels; no row leaves the database but the online nodes'.

The events (requests, claims, invokes ending, forwards, postings, webhook attempts) are
counted where they happen, in `core.metrics`.
"""

from collections import Counter
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.metrics import Reading
from gpu_share.coordinator.core.orm import (
    ArtifactRow,
    BlobRow,
    ChainPayoutRow,
    InvokeRow,
    LedgerAccountRow,
    PayoutRow,
    SessionRow,
    WebhookDeliveryRow,
)
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.core.statuses import ACTIVE_VALUES, OPEN_SESSION_VALUES
from gpu_share.coordinator.services.money import ledger
from gpu_share.coordinator.services.nodes.placement import node_verified
from gpu_share.coordinator.services.platform.overview import (
    listed_online_nodes,
    mails_failed,
    mails_waiting,
    nodes_quarantined,
)
from gpu_share.protocol.invokes import InvokeStatus

ANY_TIER = "any"  # a queued invoke that asks for no tier


async def readings(session: AsyncSession, now: datetime, settings: Settings) -> list[Reading]:
    return [
        *await _work(session),
        *await _nodes(session, now, settings),
        await _sessions(session),
        *await _storage(session, now),
        await _money(session),
        *await _payouts(session),
        await _deliveries(session),
        Reading(
            "gpushare_mails",
            "Outbox mails not sent yet (waiting) and given up (failed)",
            ("state",),
            [
                (("waiting",), await mails_waiting(session)),
                (("failed",), await mails_failed(session)),
            ],
        ),
    ]


async def _work(session: AsyncSession) -> list[Reading]:
    tier = func.coalesce(InvokeRow.constraints["tier"].as_string(), ANY_TIER)
    queued = await session.execute(
        select(InvokeRow.runtime, InvokeRow.priority, tier, func.count())
        .where(InvokeRow.status == InvokeStatus.QUEUED.value)
        .group_by(InvokeRow.runtime, InvokeRow.priority, tier)
    )
    active = await session.execute(
        select(InvokeRow.runtime, InvokeRow.status, func.count())
        .where(InvokeRow.status.in_(ACTIVE_VALUES))
        .group_by(InvokeRow.runtime, InvokeRow.status)
    )
    return [
        Reading(
            "gpushare_invokes_queued",
            "Invokes waiting for a node, by runtime, priority and the tier they ask for",
            ("runtime", "priority", "tier"),
            [((runtime, priority, str(t)), n) for runtime, priority, t, n in queued.all()],
        ),
        Reading(
            "gpushare_invokes_active",
            "Invokes leased to a node (assigned, running), by runtime",
            ("runtime", "status"),
            [((runtime, status), n) for runtime, status, n in active.all()],
        ),
    ]


async def _nodes(session: AsyncSession, now: datetime, settings: Settings) -> list[Reading]:
    """Online capacity as the admin's overview counts it (never a quarantined node)."""
    nodes: Counter[tuple[str, str]] = Counter()
    gpus: Counter[tuple[str]] = Counter()
    for node in await listed_online_nodes(session, now, settings):
        nodes[(node.tier, "true" if node_verified(node) else "false")] += 1
        gpus[(node.tier,)] += node.listed_gpus
    return [
        Reading(
            "gpushare_nodes_online",
            "Nodes online and listed, by their provider's tier and whether all their "
            "hardware is proven",
            ("tier", "verified"),
            list(nodes.items()),
        ),
        Reading(
            "gpushare_gpus_online",
            "GPUs the online nodes offer (those whose benchmark has not failed), by tier",
            ("tier",),
            list(gpus.items()),
        ),
        Reading(
            "gpushare_nodes_quarantined",
            "Nodes caught returning wrong results: never online capacity",
            (),
            [((), await nodes_quarantined(session))],
        ),
    ]


async def _sessions(session: AsyncSession) -> Reading:
    rows = await session.execute(
        select(SessionRow.status, func.count())
        .where(SessionRow.status.in_(OPEN_SESSION_VALUES))
        .group_by(SessionRow.status)
    )
    return Reading(
        "gpushare_sessions_open",
        "Sessions open (starting, ready), by status",
        ("status",),
        [((status,), n) for status, n in rows.all()],
    )


async def _storage(session: AsyncSession, now: datetime) -> list[Reading]:
    artifacts = await session.execute(
        select(ArtifactRow.kind, func.count(), func.coalesce(func.sum(ArtifactRow.size), 0))
        .where(ArtifactRow.expires_at > now)
        .group_by(ArtifactRow.kind)
    )
    by_kind = artifacts.all()
    stored = (
        await session.execute(select(func.count(), func.coalesce(func.sum(BlobRow.size), 0)))
    ).one()
    return [
        Reading(
            "gpushare_artifacts",
            "Artifacts tenants hold, by kind",
            ("kind",),
            [((kind,), n) for kind, n, _ in by_kind],
        ),
        Reading(
            "gpushare_artifact_bytes",
            "Bytes of the artifacts tenants hold, by kind (the same content counted per artifact)",
            ("kind",),
            [((kind,), size) for kind, _, size in by_kind],
        ),
        Reading(
            "gpushare_stored_bytes",
            "Bytes in the artifact store: each distinct content once",
            (),
            [((), stored[1])],
        ),
    ]


async def _money(session: AsyncSession) -> Reading:
    kept = await session.execute(
        select(
            LedgerAccountRow.kind, func.coalesce(func.sum(LedgerAccountRow.balance_micro), 0)
        ).group_by(LedgerAccountRow.kind)
    )
    values = [((kind,), total) for kind, total in kept.all()]
    for kind in sorted(ledger.SHARED):
        values.append(((kind.value,), await ledger.balance(session, ledger.Account(kind))))
    return Reading(
        "gpushare_ledger_balance_micro_usdc",
        "The books: the balance of every account of a kind, in micro-USDC (world is money "
        "that came in or went out, so it is negative what the others hold)",
        ("account",),
        values,
    )


async def _payouts(session: AsyncSession) -> list[Reading]:
    payouts = await session.execute(
        select(
            PayoutRow.status, func.count(), func.coalesce(func.sum(PayoutRow.amount_micro), 0)
        ).group_by(PayoutRow.status)
    )
    by_status = payouts.all()
    chain = await session.execute(
        select(ChainPayoutRow.state, func.count()).group_by(ChainPayoutRow.state)
    )
    return [
        Reading(
            "gpushare_payouts",
            "Payouts to providers, by status",
            ("status",),
            [((status,), n) for status, n, _ in by_status],
        ),
        Reading(
            "gpushare_payouts_micro_usdc",
            "Micro-USDC of the payouts to providers, by status",
            ("status",),
            [((status,), amount) for status, _, amount in by_status],
        ),
        Reading(
            "gpushare_chain_payouts",
            "USDC payouts the platform sends on Solana, by state",
            ("state",),
            [((state,), n) for state, n in chain.all()],
        ),
    ]


async def _deliveries(session: AsyncSession) -> Reading:
    rows = await session.execute(
        select(WebhookDeliveryRow.status, func.count()).group_by(WebhookDeliveryRow.status)
    )
    return Reading(
        "gpushare_webhook_deliveries",
        "Webhook deliveries, by status (pending: not answered 2xx yet)",
        ("status",),
        [((status,), n) for status, n in rows.all()],
    )
