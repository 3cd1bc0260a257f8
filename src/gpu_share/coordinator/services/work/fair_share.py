"""Fair share across tenants in the claim (SPEC §4.1): the queued invokes a node looks at,
in order, and the turn each tenant takes.

The order: on-demand before spot, then the tenant served longest ago first
(`TenantRow.last_served_at`), then oldest first. Within one claim the tenants take one
slot each in turn (`round_robin`), and each tenant served goes to the back of the line
(`mark_served`).
"""

from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.db import driver_of
from gpu_share.coordinator.core.driver_sql import Sql
from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.coordinator.services.work import check_offers
from gpu_share.protocol.invokes import InvokeStatus, Priority

CANDIDATES = 64  # queued rows examined per claim

# A queued invoke as the claim first looks at it: (id, tenant_id, runtime, gpus,
# constraints, created_at, priority, timeout_sec). The constraints come as their JSON
# text: a claim parses each distinct text once (`claims`), not each of 64 rows.
Candidate = tuple[str, str, str, int, str, datetime, str, int]

_COLUMNS = "id, tenant_id, runtime, gpus, constraints, created_at, priority, timeout_sec"


def _pg_columns(table: str) -> str:
    """`_COLUMNS` of `table` on PostgreSQL, the constraints as their text (`Candidate`)."""
    return ", ".join(
        f"{table}.constraints::text AS constraints" if c == "constraints" else f"{table}.{c}"
        for c in _COLUMNS.split(", ")
    )


# A reservation's work is read apart (`reservation_holds.queued_work`): it runs on its node
# only.
_QUEUED = f"invokes.status = '{InvokeStatus.QUEUED.value}' AND invokes.reservation_id IS NULL"


def _fair_candidates(dialect: str, checker: bool) -> Sql:
    """The statement of `candidates`, for `:runtimes` (and `:node_id` for a `checker`), on
    the driver (`driver_sql`): every claim reads it.

    On PostgreSQL each tenant's own first few come from an index scan (a LATERAL join),
    so the cost follows the number of tenants with queued work, not the queue's length;
    SQLite (one process, the embedded mode) sorts the queue."""
    where = f"{_QUEUED} AND {check_offers.offered(checker)}"
    if dialect != "postgresql":
        return Sql(
            f"SELECT {', '.join(f'invokes.{c}' for c in _COLUMNS.split(', '))}"  # noqa: S608
            " FROM invokes JOIN tenants ON tenants.id = invokes.tenant_id"
            f" WHERE {where} AND runtime IN (SELECT value FROM json_each(:runtimes))"
            f" ORDER BY CASE WHEN priority = '{Priority.ON_DEMAND.value}' THEN 0 ELSE 1 END,"
            " tenants.last_served_at ASC NULLS FIRST, invokes.created_at, invokes.id"
            f" LIMIT {CANDIDATES}",
            datetimes=("created_at",),
            jsons=("runtimes",),  # the constraints stay text (`Candidate`)
        )
    # PRIORITY_ORDER holds: "on_demand" sorts before "spot", so the index serves the order.
    return Sql(
        f"SELECT {_pg_columns('own')}"  # noqa: S608
        f" FROM tenants JOIN LATERAL (SELECT {_COLUMNS} FROM invokes"
        f" WHERE invokes.tenant_id = tenants.id AND {where} AND runtime = ANY(:runtimes)"
        f" ORDER BY priority, created_at LIMIT {CANDIDATES}) AS own ON true"
        " ORDER BY own.priority, tenants.last_served_at ASC NULLS FIRST, own.created_at, own.id"
        f" LIMIT {CANDIDATES}"
    )


_CANDIDATES = {
    (dialect, checker): _fair_candidates(dialect, checker)
    for dialect in ("postgresql", "sqlite")
    for checker in (False, True)
}


async def candidates(session: AsyncSession, node: NodeRow, checker: bool) -> list[Candidate]:
    """The first `CANDIDATES` queued invokes this node serves the runtime of, in fair-share
    order, without locking them. Spot checks among them only for a `checker`
    (`check_offers`)."""
    tx = await driver_of(session)
    params = {"runtimes": list(node.runtimes), **({"node_id": node.id} if checker else {})}
    rows = await tx.fetch(_CANDIDATES[tx.dialect, checker], **params)
    return [
        (
            row["id"],
            row["tenant_id"],
            row["runtime"],
            row["gpus"],
            row["constraints"],
            row["created_at"],
            row["priority"],
            row["timeout_sec"],
        )
        for row in rows
    ]


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
