"""Registering a machine (SPEC §3.8; docs/operations.md, "Machine identity"): the token
checked, the machine told by its hardware, and where a new node's score starts.

Reliability and trust follow the provider and the hardware, never the node id:

- a machine whose fingerprint or GPU (`nodes.hardware`) one of the provider's nodes
  holds *is* that node: registering again, with any of the provider's tokens, returns
  it, with everything kept under its id;
- hardware of a quarantined node, of any provider, cannot register again;
- hardware another provider's node holds (heard from within `hardware.HELD_FOR`) cannot
  register either: a machine is in one provider's account at a time;
- a genuinely new node starts at its provider's published score (`starting_score`), so
  a new node id is no fresh start either.
"""

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.coordinator.services.nodes import hardware, nodes
from gpu_share.coordinator.services.providers import enrollment_tokens, reliability
from gpu_share.protocol.agent import NodeInventory


@dataclass(frozen=True)
class Enrolled:
    node_id: str
    node_key: str
    returning: bool  # a known machine: its node again


def _closest(own: list[NodeRow], fingerprint: str | None, uuids: set[str]) -> NodeRow:
    """The node the machine is, when more than one of the provider's hold some of it: the
    same fingerprint first, then the most GPUs in common, then the last heard from."""

    def likeness(row: NodeRow) -> tuple[bool, int, datetime]:
        seen = row.last_seen_at or row.registered_at
        same = bool(fingerprint) and row.fingerprint == fingerprint
        return same, len(uuids & hardware.gpu_uuids(row.gpus)), seen

    return max(own, key=likeness)


async def enroll(
    session: AsyncSession, token: str, inventory: NodeInventory, now: datetime
) -> Enrolled:
    provider, used = await enrollment_tokens.provider_for(session, token, now)
    fingerprint, uuids = inventory.fingerprint, hardware.gpu_uuids(inventory.gpus)
    held = await hardware.holders(session, fingerprint, uuids)
    hardware.refuse_taken(held, provider.id, uuids, now)
    own = [row for row in held if row.provider_id == provider.id]
    if own:
        node = _closest(own, fingerprint, uuids)
        node_key = await nodes.register_again(
            session, node, provider, inventory, now, enrollment_token_id=used.id
        )
        return Enrolled(node.id, node_key, returning=True)
    row, node_key = await nodes.register(
        session,
        provider,
        inventory,
        now,
        enrollment_token_id=used.id,
        reliability=reliability.starting_reliability(provider, now),
    )
    return Enrolled(row.id, node_key, returning=False)
