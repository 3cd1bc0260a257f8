"""How often a node's jobs are re-run on a trusted node (docs/trust.md, "Spot checks").

BOINC's adaptive replication, per host and application version: a new host is checked
often, every consecutive valid result makes the next check less likely, any invalid
one starts it over. Here, per node and runtime (a node honest on its CPU work may cheat
on its GPU work, and the runtimes fail differently):

    rate = max(floor, start × ½ ^ ⌊streak / halving⌋)

`streak` counts consecutive matches; a mismatch sets it back to 0 (the node is
quarantined too), an inconclusive check changes nothing. With the defaults (start 0.5,
halving every 10 matches, floor 0.03) a new node has every other job checked, a cheat
that fakes everything is caught at its first checked job (within 7 jobs 99 % of the
time), and a node that turns to cheating after any record is still caught within 200
fabricated results 99.8 % of the time (1 − 0.97²⁰⁰).

The record lives on the node (`nodes/trusted.py` holds its shape); each change is made
with the node's row locked, so replicas never lose a count.
"""

from collections.abc import Collection
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.nodes.trusted import RuntimeRecord, record_of
from gpu_share.coordinator.services.trust.comparison import Outcome


@dataclass(frozen=True)
class RatePolicy:
    start: float = 0.5
    floor: float = 0.03
    halving: int = 10

    @classmethod
    def of(cls, settings: Settings) -> "RatePolicy":
        return cls(
            settings.spot_check_start_rate,
            settings.spot_check_floor_rate,
            settings.spot_check_halving_matches,
        )

    def rate(self, streak: int) -> float:
        return max(self.floor, self.start * 0.5 ** (streak // self.halving))


def current_rate(node: NodeRow, runtime: str, policy: RatePolicy) -> float:
    """The chance that the node's next `runtime` job is checked (from its streak, so a
    change of the settings applies at once)."""
    entry = record_of(node, policy.start).runtimes.get(runtime)
    return policy.rate(entry.streak if entry is not None else 0)


async def locked_node(session: AsyncSession, node_id: str) -> NodeRow | None:
    return (await locked_nodes(session, {node_id})).get(node_id)


async def locked_nodes(session: AsyncSession, node_ids: Collection[str]) -> dict[str, NodeRow]:
    """The nodes, each row locked for its record's change; locked in id order, so two
    transactions locking overlapping sets never wait on each other in a cycle."""
    rows = await session.scalars(
        select(NodeRow)
        .where(NodeRow.id.in_(sorted(node_ids)))
        .order_by(NodeRow.id)
        .with_for_update(),
        execution_options={"populate_existing": True},
    )
    return {node.id: node for node in rows.all()}


def _update(node: NodeRow, runtime: str, policy: RatePolicy, change: str) -> None:
    record = record_of(node, policy.start)
    entry = record.runtimes.setdefault(runtime, RuntimeRecord(rate=policy.start))
    if change == "decided":
        entry.decided += 1
    elif change == "checked":
        entry.decided += 1
        entry.checked += 1
    elif change == Outcome.MATCH.value:
        entry.streak += 1
        entry.matched += 1
    elif change == Outcome.MISMATCH.value:
        entry.streak = 0
        entry.mismatched += 1
    else:
        entry.inconclusive += 1
    entry.rate = policy.rate(entry.streak)
    node.spot_checks = record.to_json()  # a new object: the JSON column sees the change


def record_decision(node: NodeRow, runtime: str, checked: bool, policy: RatePolicy) -> None:
    """One of the node's jobs ended and was picked for a check, or not."""
    _update(node, runtime, policy, "checked" if checked else "decided")


def record_outcome(node: NodeRow, runtime: str, outcome: Outcome, policy: RatePolicy) -> None:
    """A check of one of its jobs came back."""
    _update(node, runtime, policy, outcome.value)
