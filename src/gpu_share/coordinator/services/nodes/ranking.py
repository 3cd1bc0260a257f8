"""How nodes rank among those that can take a job (SPEC §4.1; docs/placement.md):

    rank = 0.45 × reliability + 0.35 × benchmark + 0.20 × price + 0.05 × enterprise

- reliability: the node's published score in [0, 1]; before its first computation,
  `UNSCORED_RELIABILITY`.
- benchmark: the mean score of its listed GPUs (a CPU node: the node's own score),
  capped at 1; before its first run, `UNBENCHMARKED`.
- price: 1 / (1 + price / `PRICE_SCALE_MICRO`): free is 1, 2 USDC per GPU-hour is 0.5.
- enterprise: 1 for Enterprise-tier nodes (data centers, UPS) whose hardware is proven
  (`placement.node_verified`), else 0: the tier's advantage counts only for proven
  hardware (docs/trust.md).

Everything is in [0, 1.05]; higher is better. Ties go to the node that polls first.
"""

from typing import Any

from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.coordinator.services.nodes.placement import (
    listed_gpu,
    node_verified,
    reliability_of,
)
from gpu_share.protocol.nodes import Tier

WEIGHTS = {"reliability": 0.45, "benchmark": 0.35, "price": 0.20, "enterprise": 0.05}
UNSCORED_RELIABILITY = 0.9
UNBENCHMARKED = 0.8
PRICE_SCALE_MICRO = 2_000_000


def benchmark_score(node: NodeRow) -> float | None:
    state: dict[str, Any] = node.benchmark_state or {}
    if node.gpus:
        verdicts = state.get("gpus") or {}
        scores = [
            float(verdicts[str(gpu.get("uuid"))]["score"])
            for gpu in node.gpus
            if listed_gpu(node, gpu) and isinstance(verdicts.get(str(gpu.get("uuid"))), dict)
        ]
        return min(1.0, sum(scores) / len(scores)) if scores else None
    verdict = state.get("node")
    return min(1.0, float(verdict["score"])) if isinstance(verdict, dict) else None


def components(node: NodeRow) -> dict[str, float]:
    reliability = reliability_of(node)
    benchmark = benchmark_score(node)
    price = node.price_per_gpu_hour_micro or 0
    enterprise = node.tier == Tier.ENTERPRISE.value and node_verified(node)
    return {
        "reliability": UNSCORED_RELIABILITY if reliability is None else reliability,
        "benchmark": UNBENCHMARKED if benchmark is None else benchmark,
        "price": 1 / (1 + price / PRICE_SCALE_MICRO),
        "enterprise": 1.0 if enterprise else 0.0,
    }


def rank(node: NodeRow) -> float:
    parts = components(node)
    return round(sum(WEIGHTS[name] * value for name, value in parts.items()), 6)
