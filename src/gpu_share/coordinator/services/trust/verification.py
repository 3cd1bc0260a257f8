"""What passing or failing a challenge does to the node's `verification`.

`NodeRow.verification` is read by placement, the offers and the pages, in this shape:

    {"<gpu uuid>": {"model": "<catalog name>", "verified_at": "<iso>",
                    "challenge_id": "chl_…", "rate_tflops": <measured>},
     "cpu": {"cores": <n>, "verified_at": "<iso>", "challenge_id": "chl_…",
             "rate_gflops": <measured>}}

A pass writes the target's entry; a failure (or an expiry) removes it. When a pass
leaves no claim of the round due, the node's next round is set at a random time
`challenge_recheck_min_days`…`max_days` ahead, so a node cannot tell when it comes.
"""

import random
from datetime import datetime, timedelta
from typing import Any

from gpu_share.coordinator.core.orm import ChallengeRow, NodeRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.trust import hardware_claims
from gpu_share.protocol.trust import ChallengeKind

_rng = random.SystemRandom()


def significant(rate: float) -> float:
    """A measured rate to four significant figures: what a clock over a round trip knows."""
    return float(f"{rate:.4g}")


def entry_for(row: ChallengeRow, now: datetime, rate: float) -> dict[str, Any]:
    if row.params.get("kind") == ChallengeKind.CPU:
        cores = int(row.claimed_model.split()[0])  # "<n> cores" (`hardware_claims.claims_of`)
        return {
            "cores": cores,
            "verified_at": now.isoformat(),
            "challenge_id": row.id,
            "rate_gflops": significant(rate),
        }
    return {
        "model": row.claimed_model,
        "verified_at": now.isoformat(),
        "challenge_id": row.id,
        "rate_tflops": significant(rate),
    }


def next_round(now: datetime, settings: Settings) -> datetime:
    days = _rng.uniform(settings.challenge_recheck_min_days, settings.challenge_recheck_max_days)
    return now + timedelta(days=days)


def record_pass(
    node: NodeRow, row: ChallengeRow, now: datetime, rate: float, settings: Settings
) -> None:
    node.verification = {**(node.verification or {}), row.target: entry_for(row, now, rate)}
    recheck_at = node.next_challenge_at
    round_open = recheck_at is not None and recheck_at <= now
    left = [
        c for c in hardware_claims.due_claims(node, now, set()) if hardware_claims.proof_of(node, c)
    ]
    if recheck_at is None or (round_open and not left):
        node.next_challenge_at = next_round(now, settings)


def record_failure(node: NodeRow, row: ChallengeRow) -> None:
    """The target is no longer verified; it is due again after `challenge_retry_sec`."""
    node.verification = {k: v for k, v in (node.verification or {}).items() if k != row.target}
