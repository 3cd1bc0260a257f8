"""Whether a node's result is the one a trusted node computed for the same job
(docs/trust.md, "How results are compared"): pure functions of the two results.

No honest node may ever be caught by floating-point noise, so every rule leans one way:
whatever could be an honest difference counts as a match or as inconclusive, never as
a mismatch, and a mismatch is only ever taken from a difference no hardware makes.

ONNX outputs, array by array:
- the same names, dtypes and ranks; a length that differs by a little (dynamic outputs
  such as detections kept after a threshold) is inconclusive, any other shape a mismatch;
- floats: element by element, |a − b| ≤ atol · max(scale, floor) + rtol · |b|, `b` the
  trusted value and `scale` the largest magnitude in the trusted array; NaN where both
  are NaN, and equal infinities, are equal. A few elements may be out (near-ties of an
  argmax or a threshold inside the graph): up to `outlier_share` of a large array;
- integers, booleans and strings exactly, but for the same share plus two elements
  (a label is an argmax: on near-tied logits another GPU may pick the other one).
A small array with a few elements out is inconclusive rather than a match: it says
nothing either way.

CatBoost: the trusted node scores the model the node returned on the job's data
(`catboost_evaluation` on the agent) and this compares what it measured with what the
node reported. Failures: a failure that does not happen on the trusted node.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from gpu_share.coordinator.core.settings import Settings
from gpu_share.npz_reading import Array, dtype_name

HEAD = 6  # values of each array kept for the evidence
LARGE_ARRAY = 100  # elements from which a few outliers still leave a match
INTEGER_SLACK = 2  # labels that may flip on near-ties, on top of the share
SHAPE_SLACK = 0.1  # a dynamic length that differs by this share (or 2) is inconclusive
# Below these magnitudes a float is noise: the tolerance never shrinks under them.
SCALE_FLOOR = {"float16": 1e-3, "bfloat16": 1e-3, "float32": 1e-6, "float64": 1e-6}


class Outcome(StrEnum):
    MATCH = "match"
    MISMATCH = "mismatch"
    INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    reason: str  # one sentence, for the admin, the provider and the log
    details: dict[str, Any] = field(default_factory=dict)  # JSON: what was compared

    @classmethod
    def match(cls, reason: str, **details: Any) -> "Verdict":
        return cls(Outcome.MATCH, reason, details)

    @classmethod
    def mismatch(cls, reason: str, **details: Any) -> "Verdict":
        return cls(Outcome.MISMATCH, reason, details)

    @classmethod
    def inconclusive(cls, reason: str, **details: Any) -> "Verdict":
        return cls(Outcome.INCONCLUSIVE, reason, details)


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float  # times the largest magnitude in the trusted array


@dataclass(frozen=True)
class Tolerances:
    floats: Mapping[str, Tolerance]
    outlier_share: float = 0.01
    metric_rtol: float = 1e-3

    @classmethod
    def of(cls, settings: Settings) -> "Tolerances":
        s = settings
        return cls(
            floats={
                "float16": Tolerance(s.spot_check_rtol_fp16, s.spot_check_atol_fp16),
                "bfloat16": Tolerance(s.spot_check_rtol_bf16, s.spot_check_atol_bf16),
                "float32": Tolerance(s.spot_check_rtol_fp32, s.spot_check_atol_fp32),
                "float64": Tolerance(s.spot_check_rtol_fp64, s.spot_check_atol_fp64),
            },
            outlier_share=s.spot_check_outlier_share,
            metric_rtol=s.spot_check_metric_rtol,
        )

    def for_float(self, name: str) -> Tolerance:
        """complex64 is held to float32's, complex128 to float64's; an unknown width to
        the loosest."""
        width = {"complex64": "float32", "complex128": "float64"}.get(name, name)
        return self.floats.get(width) or max(self.floats.values(), key=lambda t: t.rtol)


DEFAULT_TOLERANCES = Tolerances(
    floats={
        "float16": Tolerance(5e-2, 5e-2),
        "bfloat16": Tolerance(1e-1, 1e-1),
        "float32": Tolerance(1e-2, 1e-2),
        "float64": Tolerance(1e-6, 1e-6),
    }
)


def describe(array: Array) -> dict[str, Any]:
    """An array as the evidence shows it: dtype, shape and its first values."""
    flat = array.reshape(-1)[:HEAD]
    return {
        "dtype": dtype_name(array.dtype),
        "shape": list(array.shape),
        "head": [_plain(v) for v in flat.tolist()],
    }


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, complex):
        return str(value)
    if isinstance(value, bytes):
        return value[:64].decode("latin1")
    return value


def compare_outputs(
    node: Mapping[str, Array], trusted: Mapping[str, Array], tol: Tolerances
) -> Verdict:
    """The node's output arrays against the trusted node's (module doc)."""
    if set(node) != set(trusted):
        return Verdict.mismatch(
            f"the outputs are named {sorted(node)}, the trusted node's {sorted(trusted)}",
            node={name: describe(a) for name, a in node.items()},
            trusted={name: describe(a) for name, a in trusted.items()},
        )
    arrays: dict[str, Any] = {}
    worst = Outcome.MATCH
    reasons: list[str] = []
    for name in sorted(trusted):
        verdict = compare_array(name, node[name], trusted[name], tol)
        arrays[name] = {
            "outcome": verdict.outcome.value,
            "reason": verdict.reason,
            "node": describe(node[name]),
            "trusted": describe(trusted[name]),
            **verdict.details,
        }
        if verdict.outcome is Outcome.MISMATCH:
            worst = Outcome.MISMATCH
            reasons.append(verdict.reason)
        elif verdict.outcome is Outcome.INCONCLUSIVE and worst is Outcome.MATCH:
            worst = Outcome.INCONCLUSIVE
            reasons.append(verdict.reason)
    if worst is Outcome.MATCH:
        return Verdict.match(f"{len(trusted)} output arrays agree", arrays=arrays)
    return Verdict(worst, "; ".join(reasons), {"arrays": arrays})


def compare_array(name: str, node: Array, trusted: Array, tol: Tolerances) -> Verdict:
    label = f'"{name}"'
    if node.dtype != trusted.dtype:
        return Verdict.mismatch(
            f"{label} is {dtype_name(node.dtype)}, the trusted node's {dtype_name(trusted.dtype)}"
        )
    if node.shape != trusted.shape:
        near = node.ndim == trusted.ndim and all(
            abs(a - b) <= max(2, SHAPE_SLACK * max(a, b))
            for a, b in zip(node.shape, trusted.shape, strict=True)
        )
        why = f"{label} has shape {list(node.shape)}, the trusted node's {list(trusted.shape)}"
        if near:
            return Verdict.inconclusive(why + " (a dynamic length, as after a threshold)")
        return Verdict.mismatch(why)
    size = int(trusted.size)
    if size == 0:
        return Verdict.match(f"{label} is empty on both")
    kind = trusted.dtype.kind
    if kind in "fc":
        out, details = _floats_out(node, trusted, tol.for_float(dtype_name(trusted.dtype)))
        slack = 0
    else:
        out = int(np.count_nonzero(node != trusted))
        details = {}
        slack = INTEGER_SLACK
    allowed = math.floor(tol.outlier_share * size) + slack
    details = {"out_of_tolerance": out, "allowed": allowed, "elements": size, **details}
    if out == 0:
        return Verdict.match(f"{label} agrees", **details)
    if out > allowed:
        return Verdict.mismatch(
            f"{label}: {out} of {size} elements differ beyond tolerance", **details
        )
    if size >= LARGE_ARRAY:
        return Verdict.match(f"{label} agrees but for {out} of {size} elements", **details)
    return Verdict.inconclusive(
        f"{label}: {out} of {size} elements differ, too few to tell", **details
    )


def _floats_out(node: Array, trusted: Array, tol: Tolerance) -> tuple[int, dict[str, Any]]:
    """How many elements are out of tolerance, and the numbers that decided it."""
    complex_ = trusted.dtype.kind == "c"
    a = node.astype(np.complex128 if complex_ else np.float64)
    b = trusted.astype(np.complex128 if complex_ else np.float64)
    finite_a, finite_b = np.isfinite(a), np.isfinite(b)
    both = finite_a & finite_b
    magnitudes = np.abs(b[finite_b])
    scale = float(magnitudes.max()) if magnitudes.size else 0.0
    floor = SCALE_FLOOR.get(dtype_name(trusted.dtype).replace("complex128", "float64"), 1e-6)
    atol = tol.atol * max(scale, floor)
    diff = np.abs(a[both] - b[both])
    out = int(np.count_nonzero(diff > atol + tol.rtol * np.abs(b[both])))
    # Not both finite: equal only as the same infinity, or NaN on both.
    odd = ~both
    if odd.any():
        same = (np.isnan(a) & np.isnan(b)) | (np.isinf(a) & np.isinf(b) & (a == b))
        out += int(np.count_nonzero(odd & ~same))
    return out, {
        "max_abs_diff": float(diff.max()) if diff.size else 0.0,
        "scale": scale,
        "rtol": tol.rtol,
        "atol": atol,
    }
