"""What one node is busy with now, read in one statement for the claim (`claims`).

A claim needs the node's whole load: how many invokes it runs, which GPUs those and its
whole-GPU sessions hold, the memory its sessions reserve, and the reservations in force
or booked on it. Read one query at a time that cost a claim six round trips and most of
its time (bench/README.md, dispatch); here they are one `UNION ALL` of three plain
selects, each branch using its table's node index, run on the driver with the node and
the time as parameters; the rules stay with their owners (`reservation_holds` for
reservations, `memory_fit` for memory). A claim reads it inside its node's read, as one
JSON column (`in_node_read`): its node and its load in one round trip.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
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


def _rows_of(node: str) -> str:
    """The node's load as rows, for the node `node` names (a parameter or a column) at
    `:now`."""
    return (
        # The reservations branch comes first: its column types (the timestamp above all)
        # decide how the union's values are read back.
        "SELECT 'r' AS kind, id AS ref, tenant_id, gpus, gpu_indices, starts_at,"  # noqa: S608
        " 0 AS reserved_mb FROM reservations"
        f" WHERE node_id = {node} AND status IN ({sql_list(LIVE)}) AND ends_at > :now"
        " UNION ALL SELECT 'i', reservation_id, NULL, gpus, gpu_indices, NULL, 0 FROM invokes"
        f" WHERE node_id = {node} AND status IN ({sql_list(ACTIVE_VALUES)})"
        " UNION ALL SELECT 's', NULL, NULL, gpus, gpu_indices, NULL, reserved_mb"
        f" FROM gpu_sessions WHERE node_id = {node}"
        f" AND status IN ({sql_list(OPEN_SESSION_VALUES)})"
    )


_COLUMNS = ("kind", "ref", "tenant_id", "gpus", "gpu_indices", "starts_at", "reserved_mb")

_ROWS = Sql(_rows_of(":node_id"), datetimes=("starts_at",), jsons=("gpu_indices",))
"""The node's load as rows, for `:node_id` at `:now` (module doc); on the driver
(`driver_sql`)."""


def in_node_read(dialect: str) -> str:
    """The node's load as one JSON column, `node_load`, of a read of its `nodes` row (at
    `:now`): a claim reads its node and its load in one round trip (`load_from_json`)."""
    columns = ", ".join(f"l.{c}" for c in _COLUMNS)
    if dialect == "postgresql":
        aggregate = f"json_agg(json_build_array({columns}))"
    else:
        columns = columns.replace("l.gpu_indices", "json(l.gpu_indices)")
        aggregate = f"json_group_array(json_array({columns}))"
    return f"(SELECT {aggregate} FROM ({_rows_of('nodes.id')}) AS l) AS node_load"  # noqa: S608 (constants)


def load_from_json(items: list[list[Any]] | None, node_id: str, now: datetime) -> NodeLoad:
    """`load_of`'s answer from the `node_load` column of `in_node_read`."""
    rows = []
    for item in items or []:
        row = dict(zip(_COLUMNS, item, strict=True))
        if row["starts_at"] is not None:  # ISO text in JSON; SQLite's naive UTC
            starts_at = datetime.fromisoformat(row["starts_at"])
            row["starts_at"] = starts_at if starts_at.tzinfo else starts_at.replace(tzinfo=UTC)
        rows.append(row)
    return _load(rows, node_id, now)


def _indices(row: Any) -> set[int]:
    return {int(i) for i in row["gpu_indices"] or []}


async def load_of(session: AsyncSession, node_id: str, now: datetime) -> NodeLoad:
    tx = await driver_of(session)
    return _load(await tx.fetch(_ROWS, node_id=node_id, now=now), node_id, now)


def _load(rows: Iterable[Any], node_id: str, now: datetime) -> NodeLoad:
    running = 0
    held: set[int] = set()
    session_mb = 0
    used: dict[str, int] = {}  # GPUs each reservation's own running work uses
    reservations: list[Any] = []
    for row in rows:
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
