"""Which node a machine is, told by its hardware rather than by a node id
(docs/operations.md, "Machine identity").

An agent sends a fingerprint of its machine (`agent/fingerprint.py`) and each GPU's UUID
(NVML's, unique to the board). A node *holds* that hardware when it has the same
fingerprint or any of the same GPUs: a machine registering again, with the same token or
another, is that node again, and whatever a provider's record is kept under (its node
id) follows it. Everything the agent sends is its own word, so this stops an honest
re-registration and a casual reset; the starting score (`providers/enrollment.py`) is
what makes a deliberate one pointless.
"""

import json
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Text, cast, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.errors import Forbidden
from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.protocol.nodes import GpuInfo

# Shorter "UUIDs" are not NVML's (an agent that could not read one sends ""): not identity.
MIN_UUID_LENGTH = 8
# Another provider's node heard from this recently still holds its hardware: a machine is
# in one provider's account at a time. Past it the hardware may move to a new owner.
HELD_FOR = timedelta(days=1)


def gpu_uuids(gpus: Iterable[GpuInfo | Mapping[str, Any]]) -> set[str]:
    """The GPU UUIDs that identify hardware, from an inventory's GPUs or a node row's."""
    found = set()
    for gpu in gpus:
        uuid = gpu.uuid if isinstance(gpu, GpuInfo) else gpu.get("uuid")
        if isinstance(uuid, str) and len(uuid.strip()) >= MIN_UUID_LENGTH:
            found.add(uuid.strip())
    return found


def holds(row: NodeRow, fingerprint: str | None, uuids: set[str]) -> bool:
    return bool(fingerprint and row.fingerprint == fingerprint) or bool(uuids & gpu_uuids(row.gpus))


async def holders(session: AsyncSession, fingerprint: str | None, uuids: set[str]) -> list[NodeRow]:
    """Every node, of any provider, holding the machine's fingerprint or one of its GPUs,
    oldest first. GPUs are stored as JSON on the node; each UUID is looked for in its text
    as JSON writes it, then checked exactly."""
    wanted = [NodeRow.fingerprint == fingerprint] if fingerprint else []
    as_text = cast(NodeRow.gpus, Text)
    wanted += [as_text.contains(json.dumps(uuid), autoescape=True) for uuid in sorted(uuids)]
    if not wanted:
        return []
    rows = await session.scalars(
        select(NodeRow).where(or_(*wanted)).order_by(NodeRow.registered_at, NodeRow.id)
    )
    return [row for row in rows if holds(row, fingerprint, uuids)]


def live(row: NodeRow, now: datetime) -> bool:
    """Heard from within `HELD_FOR`: its hardware is still in its provider's account."""
    return row.last_seen_at is not None and row.last_seen_at >= now - HELD_FOR


def _named(held: NodeRow, uuids: set[str]) -> str:
    """What of the machine a holder has, in words for the refusal."""
    shared = sorted(uuids & gpu_uuids(held.gpus))
    return f"GPU {shared[0]}" if shared else "its machine fingerprint"


def refuse_taken(
    held: Iterable[NodeRow],
    provider_id: str,
    uuids: set[str],
    now: datetime,
) -> None:
    """Refuse hardware (a machine registering, or a node reporting new GPUs) that a
    quarantined node holds, of any provider, or that another provider's node still holds
    (heard from within `HELD_FOR`): a machine is in one provider's account at a time, and
    quarantined hardware never comes back under a new node id."""
    held = list(held)
    for row in held:
        if row.quarantined_at is not None:
            ours = row.provider_id == provider_id
            raise Forbidden(
                f"this machine's hardware ({_named(row, uuids)}) belongs to a node quarantined "
                "after a failed trust check (docs/trust.md), and such hardware cannot register "
                "again under any account. Write to the platform admin if you believe this is "
                "a mistake",
                details={"reason": "hardware_quarantined", "node_id": row.id if ours else None},
            )
    hours = int(HELD_FOR.total_seconds() // 3600)
    for row in held:
        if row.provider_id != provider_id and live(row, now):
            raise Forbidden(
                f"this machine's hardware ({_named(row, uuids)}) is registered to another "
                f"provider's node, heard from in the last {hours} hours, and a machine can be "
                "in one provider's account at a time. Stop the agent registered there: the "
                f"hardware is free {hours} hours after that node was last heard from. Ask the "
                "platform admin if the machine changed hands",
                details={"reason": "hardware_registered_elsewhere"},
            )
