"""What a node claims to be, as things a challenge can prove, and which claims are due.

A node claims each GPU as the catalog model NVML's name matches (`gpu_catalog.match`),
with the VRAM it reports; a GPU the catalog does not know cannot be challenged (there
is no rate to hold it to) and is never verified. A node without GPUs claims its cores
at the CPU baseline's per-core rate, with its RAM.

A claim is due when it is not verified (never, or as something else than it claims
now) unless its last challenge failed within `challenge_retry_sec`; and, once the
node's `next_challenge_at` has come, when it was verified before that time (a round of
re-challenges, one at a time).
"""

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.coordinator.services.nodes import gpu_catalog
from gpu_share.protocol.trust import ChallengeKind

CPU_TARGET = "cpu"
MiB = 1024 * 1024


@dataclass(frozen=True)
class Claim:
    target: str  # the GPU's UUID, or "cpu"
    kind: ChallengeKind
    model: str  # the catalog model's name; for a CPU node "<n> cores"
    rate_flops: float  # FP16 datasheet rate, or cores × the baseline's per-core rate
    memory_bytes: float
    gpu_index: int | None = None
    cores: int | None = None


def claims_of(node: NodeRow) -> list[Claim]:
    if not node.gpus:
        per_core = gpu_catalog.CPU_BASELINE.matmul_gflops_per_core * 1e9
        return [
            Claim(
                target=CPU_TARGET,
                kind=ChallengeKind.CPU,
                model=f"{node.cpu_count} cores",
                rate_flops=node.cpu_count * per_core,
                memory_bytes=node.ram_mb * MiB,
                cores=node.cpu_count,
            )
        ]
    found = []
    for gpu in node.gpus:
        vram_mb = int(gpu.get("vram_mb", 0))
        model = gpu_catalog.match(str(gpu.get("model", "")), vram_mb)
        if model is None or vram_mb <= 0 or not gpu.get("uuid"):
            continue
        found.append(
            Claim(
                target=str(gpu["uuid"]),
                kind=ChallengeKind.GPU,
                model=model.name,
                rate_flops=model.fp16_tflops * 1e12,
                memory_bytes=vram_mb * MiB,
                gpu_index=int(gpu.get("index", 0)),
            )
        )
    return found


def proof_of(node: NodeRow, claim: Claim) -> dict[str, Any] | None:
    """What the node's verification says of this claim, if it proves this claim."""
    entry = (node.verification or {}).get(claim.target)
    if not isinstance(entry, dict):
        return None
    if claim.kind is ChallengeKind.CPU:
        return entry if entry.get("cores") == claim.cores else None
    return entry if entry.get("model") == claim.model else None


def _verified_before(entry: dict[str, Any], moment: datetime) -> bool:
    try:
        return datetime.fromisoformat(str(entry["verified_at"])) < moment
    except (KeyError, ValueError):
        return True


def due_claims(node: NodeRow, now: datetime, recently_failed: set[str]) -> list[Claim]:
    """The node's claims that need a challenge now, unverified ones first."""
    unverified, round_due = [], []
    recheck_at = node.next_challenge_at
    for claim in claims_of(node):
        entry = proof_of(node, claim)
        if entry is None:
            if claim.target not in recently_failed:
                unverified.append(claim)
        elif recheck_at is not None and recheck_at <= now and _verified_before(entry, recheck_at):
            round_due.append(claim)
    return unverified + round_due
