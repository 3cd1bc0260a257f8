"""What one node is busy with now, read in one statement for the claim (`claims`).

A claim needs the node's whole load: how many invokes it runs, which GPUs those and its
whole-GPU sessions hold, the memory its sessions reserve, and the reservations in force
or booked on it. Read one query at a time that cost a claim six round trips and most of
its time (bench/README.md, dispatch); here they are one `UNION ALL` of three plain
selects, each branch using its table's node index, run on the driver with the node and
the time as parameters; the rules stay with their owners (`reservation_holds` for
reservations, `memory_fit` for memory).
"""

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.db import driver_of
from gpu_share.coordinator.core.driver_sql import Sql, sql_list
from gpu_share.coordinator.core.statuses import ACTIVE_VALUES, LIVE, OPEN_SESSION_VALUES
from gpu_share.coordinator.services.work.reservation_holds import Held, Upcoming


@dataclass(frozen=True)
class NodeLoad:
    running: int  # active invokes
    held: set[int]  # GPU indices active invokes and whole-GPU sessions hold
    session_mb: int  # memory open sessions reserve
    holds: list[Held]  # reservations in force, with the GPUs their own work uses
    upcoming: list[Upcoming]  # reservations booked that start later, soonest first


_ROWS = Sql(
    # The reservations branch comes first: its column types (the timestamp above all)
    # decide how the union's values are read back.
    "SELECT 'r' AS kind, id AS ref, tenant_id, gpus, gpu_indices, starts_at,"  # noqa: S608
    " 0 AS reserved_mb FROM reservations"
    f" WHERE node_id = :node_id AND status IN ({sql_list(LIVE)}) AND ends_at > :now"
    " UNION ALL SELECT 'i', reservation_id, NULL, gpus, gpu_indices, NULL, 0 FROM invokes"
    f" WHERE node_id = :node_id AND status IN ({sql_list(ACTIVE_VALUES)})"
    " UNION ALL SELECT 's', NULL, NULL, gpus, gpu_indices, NULL, reserved_mb FROM gpu_sessions"
    f" WHERE node_id = :node_id AND status IN ({sql_list(OPEN_SESSION_VALUES)})",
    datetimes=("starts_at",),
    jsons=("gpu_indices",),
)
"""The node's load as rows, for `:node_id` at `:now` (module doc); on the driver
(`driver_sql`): every claim reads it."""


def _indices(row: Any) -> set[int]:
    return {int(i) for i in row["gpu_indices"] or []}


async def load_of(session: AsyncSession, node_id: str, now: datetime) -> NodeLoad:
    running = 0
    held: set[int] = set()
    session_mb = 0
    used: dict[str, int] = {}  # GPUs each reservation's own running work uses
    reservations: list[Any] = []
    tx = await driver_of(session)
    for row in await tx.fetch(_ROWS, node_id=node_id, now=now):
        indices = _indices(row)
        if row["kind"] == "r":
            reservations.append(row)
        elif row["kind"] == "i":
            running += 1
            held |= indices
            if row["ref"] is not None:
                used[row["ref"]] = used.get(row["ref"], 0) + int(row["gpus"])
        else:
            session_mb += int(row["reserved_mb"] or 0)
            if row["gpus"] > 0:
                held |= indices
    holds = [
        Held(
            r["ref"],
            r["tenant_id"],
            node_id,
            r["gpus"],
            [int(i) for i in r["gpu_indices"]],
            used.get(r["ref"], 0),
        )
        for r in reservations
        if r["starts_at"] <= now
    ]
    upcoming = sorted(
        (
            Upcoming(r["starts_at"], frozenset(_indices(r)))
            for r in reservations
            if r["starts_at"] > now
        ),
        key=lambda ahead: ahead.starts_at,
    )
    return NodeLoad(running, held, session_mb, holds, upcoming)
