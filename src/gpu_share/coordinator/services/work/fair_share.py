"""Fair share across tenants in the claim (SPEC §4.1): the queued invokes a node looks at,
in order, and the turn each tenant takes.

The order: on-demand before spot, then the tenant served longest ago first
(`TenantRow.last_served_at`), then oldest first. Within one claim the tenants take one
slot each in turn (`round_robin`), and each tenant served goes to the back of the line
(`mark_served`).
"""

import functools
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import BindParameter, Row, Select, bindparam, case, select, true
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.db import driver_of
from gpu_share.coordinator.core.driver_sql import Sql
from gpu_share.coordinator.core.orm import InvokeRow, NodeRow, TenantRow
from gpu_share.coordinator.services.work import check_offers
from gpu_share.protocol.invokes import InvokeStatus, Priority

CANDIDATES = 64  # queued rows examined per claim

# A queued invoke as the claim first looks at it: (id, tenant_id, runtime, gpus,
# constraints, created_at, priority, timeout_sec).
Candidate = Row[str, str, str, int, dict[str, Any], datetime, str, int]


async def candidates(session: AsyncSession, node: NodeRow, checker: bool) -> Sequence[Candidate]:
    """The first `CANDIDATES` queued invokes this node serves the runtime of, in fair-share
    order, without locking them. Spot checks among them only for a `checker`
    (`check_offers`)."""
    query = _fair_candidates(session.get_bind().dialect.name, checker)
    params = (
        {"runtimes": node.runtimes, "node_id": node.id} if checker else {"runtimes": node.runtimes}
    )
    found: Sequence[Candidate] = (await session.execute(query, params)).all()
    return found


@functools.cache
def _fair_candidates(dialect: str, checker: bool) -> Select[Any]:
    """The statement of `candidates`, for `:runtimes` (and `:node_id` for a `checker`).
    Built once per dialect: building it cost a claim more than running it.

    On PostgreSQL each tenant's own first few come from an index scan (a LATERAL join),
    so the cost follows the number of tenants with queued work, not the queue's length;
    SQLite (one process, the embedded mode) sorts the queue."""
    runtimes: BindParameter[list[str]] = bindparam("runtimes", expanding=True)
    columns = (
        InvokeRow.id,
        InvokeRow.tenant_id,
        InvokeRow.runtime,
        InvokeRow.gpus,
        InvokeRow.constraints,
        InvokeRow.created_at,
        InvokeRow.priority,
        InvokeRow.timeout_sec,
    )
    # A reservation's work is read apart (`reservation_holds.queued_work`): it runs on its
    # node only.
    queued = (
        (InvokeRow.status == InvokeStatus.QUEUED.value)
        & InvokeRow.reservation_id.is_(None)
        & check_offers.offered(checker)
    )
    if dialect != "postgresql":
        return (
            select(*columns)
            .join(TenantRow, TenantRow.id == InvokeRow.tenant_id)
            .where(queued, InvokeRow.runtime.in_(runtimes))
            .order_by(
                case((InvokeRow.priority == Priority.ON_DEMAND.value, 0), else_=1),
                TenantRow.last_served_at.asc().nulls_first(),
                InvokeRow.created_at,
                InvokeRow.id,
            )
            .limit(CANDIDATES)
        )
    # PRIORITY_ORDER holds: "on_demand" sorts before "spot", so the index serves the order.
    own = (
        select(*columns)
        .where(InvokeRow.tenant_id == TenantRow.id, queued, InvokeRow.runtime.in_(runtimes))
        .order_by(InvokeRow.priority, InvokeRow.created_at)
        .limit(CANDIDATES)
        .lateral("own")
    )
    return (
        select(*(own.c[column.key] for column in columns))
        .select_from(TenantRow)
        .join(own, true())
        .order_by(
            own.c.priority,
            TenantRow.last_served_at.asc().nulls_first(),
            own.c.created_at,
            own.c.id,
        )
        .limit(CANDIDATES)
    )


def round_robin(eligible: list[tuple[str, str]]) -> list[str]:
    """Interleave tenants, keeping each tenant's own order: one slot each, in turn."""
    queues: dict[str, list[str]] = {}
    for invoke_id, tenant_id in eligible:
        queues.setdefault(tenant_id, []).append(invoke_id)
    ordered: list[str] = []
    while queues:
        for tenant_id in list(queues):
            ordered.append(queues[tenant_id].pop(0))
            if not queues[tenant_id]:
                del queues[tenant_id]
    return ordered


_MARK_SERVED = {
    # Rows another claim holds are passed over (`mark_served`).
    "postgresql": Sql(
        "UPDATE tenants SET last_served_at = :served_at WHERE id IN"
        " (SELECT id FROM tenants WHERE id = ANY(:served) FOR UPDATE SKIP LOCKED)"
    ),
    # One write transaction at a time: nothing is held.
    "sqlite": Sql(
        "UPDATE tenants SET last_served_at = :served_at"
        " WHERE id IN (SELECT value FROM json_each(:served))",
        jsons=("served",),
    ),
}


async def mark_served(session: AsyncSession, tenant_ids: set[str], now: datetime) -> None:
    """Move these tenants to the back of the fair-share line. On the driver
    (`driver_sql`): every claim that leases runs it.

    Best effort: a tenant row another claim holds right now is skipped rather than waited
    for (claims never wait on each other, and cannot deadlock over tenants)."""
    if not tenant_ids:
        return
    tx = await driver_of(session)
    await tx.execute(_MARK_SERVED[tx.dialect], served=sorted(tenant_ids), served_at=now)
