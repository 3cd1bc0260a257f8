"""Whether a failure a node reported happens on a trusted node too (docs/trust.md, "How
failures are checked"): a pure function of the two endings and the two machines.

`RUNTIME_ERROR`, `OUT_OF_MEMORY` and `TIMEOUT` are charged to the tenant like work, so
a node could report them without running anything and be paid. The job is run again
on a trusted node:

- it fails there too (a failure of the job: the model, its inputs, its limits): a match;
- it succeeds: for `RUNTIME_ERROR` a mismatch; for `OUT_OF_MEMORY` a mismatch only when
  the trusted node needed at most `memory_margin` of the memory the node had for the
  job (its GPU's, or its job limit), else inconclusive; for `TIMEOUT` a mismatch only
  when the trusted node finished within 1 / `timeout_margin` of the timeout after
  scaling its time by how much faster it is (datasheet figures of the GPU models, or
  cores), else inconclusive;
- it ends for a reason that says nothing of the job (no trusted node took it, its lease
  was lost, an artifact expired): inconclusive.

The machines' figures come from the catalog and the coordinator's records, never from
what the node measured of itself, which it could understate.
"""

from dataclasses import dataclass

from gpu_share.coordinator.services.trust.comparison import Verdict
from gpu_share.protocol.errors import ErrorCode

CHECKED_FAILURES = frozenset({ErrorCode.RUNTIME_ERROR, ErrorCode.OUT_OF_MEMORY, ErrorCode.TIMEOUT})
# A check that ends so shows the job fails on any machine: the node's failure was honest.
REPRODUCED = CHECKED_FAILURES | {
    ErrorCode.INVALID_MODEL,
    ErrorCode.INVALID_INPUTS,
    ErrorCode.INVALID_CONFIG,
    ErrorCode.RESOURCE_LIMIT,
}


@dataclass(frozen=True)
class FailureFacts:
    """What the two machines had for the job, and what the check needed."""

    timeout_sec: int
    check_ms: int | None  # how long the trusted node took, start to result
    check_peak_bytes: int | None  # the memory it needed (GPU for a GPU job, else RSS)
    node_memory_bytes: int | None  # what the node had for the job
    speedup: float | None  # how much faster the trusted machine is (≥ 1), None: unknown


@dataclass(frozen=True)
class Margins:
    timeout: float = 4.0
    memory: float = 0.5


def compare_failure(
    node_code: str,
    check_done: bool,
    check_code: str | None,
    facts: FailureFacts,
    margins: Margins,
) -> Verdict:
    """The node failed with `node_code` (one of `CHECKED_FAILURES`); the check ended done,
    or failed with `check_code`."""
    if not check_done:
        if check_code in {code.value for code in REPRODUCED}:
            return Verdict.match(f"the job failed on the trusted node too ({check_code})")
        return Verdict.inconclusive(
            f"the check ended with {check_code}, which says nothing of the job"
        )
    details = {
        "timeout_sec": facts.timeout_sec,
        "check_ms": facts.check_ms,
        "check_peak_bytes": facts.check_peak_bytes,
        "node_memory_bytes": facts.node_memory_bytes,
        "speedup": facts.speedup,
    }
    if node_code == ErrorCode.RUNTIME_ERROR.value:
        return Verdict.mismatch(
            "the node reported RUNTIME_ERROR; the job ran to the end on the trusted node",
            **details,
        )
    if node_code == ErrorCode.OUT_OF_MEMORY.value:
        peak, had = facts.check_peak_bytes, facts.node_memory_bytes
        if peak is not None and had is not None and peak <= margins.memory * had:
            return Verdict.mismatch(
                f"the node reported OUT_OF_MEMORY with {had} bytes; the trusted node ran the "
                f"job in {peak}",
                **details,
            )
        return Verdict.inconclusive(
            "the node reported OUT_OF_MEMORY; the trusted node ran the job, but in too much "
            "of the memory the node had (or it is not known) to tell",
            **details,
        )
    if node_code == ErrorCode.TIMEOUT.value:
        took, faster = facts.check_ms, facts.speedup
        if took is not None and faster is not None:
            scaled = took * faster
            if scaled * margins.timeout <= facts.timeout_sec * 1000:
                return Verdict.mismatch(
                    f"the node reported TIMEOUT after {facts.timeout_sec} s; the trusted node "
                    f"ran the job in {took} ms ({scaled:.0f} ms at the node's speed)",
                    **details,
                )
        return Verdict.inconclusive(
            "the node reported TIMEOUT; the trusted node ran the job, but not fast enough "
            "(or at a speed not known) to tell",
            **details,
        )
    return Verdict.inconclusive(f"{node_code} is not a failure the spot checks judge", **details)
