"""Which nodes are trusted to re-run other nodes' jobs (docs/trust.md, "Spot checks"), and
the spot-check record every node carries (`NodeRow.spot_checks`) that the rule reads.

A node is trusted when an admin marked it (`NodeRow.trusted`: the platform's own
machines), or on its record: an Enterprise node whose hardware is proven, with a long
record of checks that all matched and a high reliability score. A quarantined node is
never trusted, whatever its mark. The claim asks this of every node that leases work, so
it reads the node's row only.

The record is written by the trust domain (`trust/spot_check_rates`) and kept here, the
lowest domain that reads it, in one shape: per runtime (BOINC counts per application
version: a node honest on CPU work may cheat on its GPU work) how many jobs were
decided, checked, matched, mismatched or could not tell, the current run of
consecutive matches and the rate that follows from it; and the totals. `rate` at the
top is the rate of the runtime the node runs most, which tenants see.
"""

from dataclasses import dataclass, field
from typing import Any

from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.nodes.placement import node_verified, reliability_of
from gpu_share.protocol.nodes import Tier


@dataclass
class RuntimeRecord:
    """One runtime's spot checks on one node."""

    rate: float
    streak: int = 0  # consecutive matches since the last mismatch
    decided: int = 0  # jobs that ended and were picked for a check or not
    checked: int = 0
    matched: int = 0
    mismatched: int = 0
    inconclusive: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "streak": self.streak,
            "decided": self.decided,
            "checked": self.checked,
            "matched": self.matched,
            "mismatched": self.mismatched,
            "inconclusive": self.inconclusive,
        }


@dataclass
class SpotCheckRecord:
    runtimes: dict[str, RuntimeRecord] = field(default_factory=dict)

    @property
    def matched(self) -> int:
        return sum(r.matched for r in self.runtimes.values())

    @property
    def mismatched(self) -> int:
        return sum(r.mismatched for r in self.runtimes.values())

    def shown_rate(self) -> float | None:
        """The rate of the runtime with the most decided jobs (the higher rate on a tie)."""
        if not self.runtimes:
            return None
        busiest = max(self.runtimes.values(), key=lambda r: (r.decided, r.rate))
        return busiest.rate

    def to_json(self) -> dict[str, Any]:
        return {
            "rate": self.shown_rate(),
            "matched": self.matched,
            "mismatched": self.mismatched,
            "runtimes": {name: r.to_json() for name, r in sorted(self.runtimes.items())},
        }


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def record_of(node: NodeRow, start_rate: float) -> SpotCheckRecord:
    """The node's record as stored; a runtime it never ran starts at `start_rate`."""
    stored = (node.spot_checks or {}).get("runtimes")
    record = SpotCheckRecord()
    if not isinstance(stored, dict):
        return record
    for name, entry in stored.items():
        if not isinstance(entry, dict):
            continue
        rate = entry.get("rate")
        record.runtimes[str(name)] = RuntimeRecord(
            rate=float(rate) if isinstance(rate, int | float) and 0 < rate <= 1 else start_rate,
            streak=_count(entry.get("streak")),
            decided=_count(entry.get("decided")),
            checked=_count(entry.get("checked")),
            matched=_count(entry.get("matched")),
            mismatched=_count(entry.get("mismatched")),
            inconclusive=_count(entry.get("inconclusive")),
        )
    return record


@dataclass(frozen=True)
class TrustRule:
    """What earns trust without an admin's mark (settings `trusted_min_*`)."""

    min_clean_checks: int = 200
    min_reliability: float = 0.95

    @classmethod
    def of(cls, settings: Settings) -> "TrustRule":
        return cls(settings.trusted_min_checks, settings.trusted_min_reliability)


def trusted_by_record(node: NodeRow, rule: TrustRule) -> bool:
    """Enterprise, all its hardware proven, `min_clean_checks` matches and no mismatch
    ever, and a reliability score of at least `min_reliability`."""
    if node.tier != Tier.ENTERPRISE.value or not node_verified(node):
        return False
    score = reliability_of(node)
    if score is None or score < rule.min_reliability:
        return False
    record = node.spot_checks or {}
    matched, mismatched = record.get("matched"), record.get("mismatched")
    return _count(matched) >= rule.min_clean_checks and _count(mismatched) == 0


def is_trusted(node: NodeRow, rule: TrustRule) -> bool:
    """Whether the node may run checks of other nodes' jobs now (module doc)."""
    if node.quarantined_at is not None:
        return False
    return node.trusted or trusted_by_record(node, rule)
