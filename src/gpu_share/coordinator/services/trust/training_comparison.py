"""Whether a CatBoost training a node reported is the model it returned (docs/trust.md,
"How results are compared"): a pure function of the node's outputs and what the trusted
node measured of them.

The trusted node trains the job again (the tenant's result, should the node be caught)
and scores the model the node returned on the same data and split
(`agent/runtimes/catboost_evaluation.py`, its `evaluation_json`). Scoring a given model
is deterministic, so what it measures is held to the node's report tightly: the number
of trees, the parameters the tenant set, the feature importances (computed from the
model alone) and the eval-set value of each deterministic metric the report gives.
Two trainings are never compared with each other: CatBoost on another GPU (or on a CPU)
makes another model, honestly. A model the trusted node's CatBoost cannot load is
inconclusive (another CatBoost version may write what this one cannot read); outputs
that hold no CatBoost model at all are a mismatch.
"""

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from gpu_share.coordinator.services.trust.comparison import Tolerances, Verdict
from gpu_share.npz_reading import Array

EVALUATION = "evaluation_json"  # the array the trusted node's scoring adds to its outputs
MODEL = "model_cbm"
REPORT = "report_json"
ABSOLUTE_FLOOR = 1e-9  # metrics this close are equal, however small


def json_array(arrays: Mapping[str, Array], name: str) -> dict[str, Any] | None:
    """A UTF-8 JSON object stored as uint8 bytes, as the CatBoost runtime writes them."""
    array = arrays.get(name)
    if array is None or array.dtype != np.uint8 or array.ndim != 1:
        return None
    try:
        value = json.loads(array.tobytes().decode())
    except (UnicodeDecodeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _close(a: float, b: float, rtol: float) -> bool:
    return abs(a - b) <= rtol * max(abs(a), abs(b)) + ABSOLUTE_FLOOR


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def compare_training(
    node_outputs: Mapping[str, Array] | str,
    trusted_outputs: Mapping[str, Array],
    tol: Tolerances,
) -> Verdict:
    """`node_outputs`: the arrays the node returned, or why they could not be read."""
    if isinstance(node_outputs, str):
        return Verdict.mismatch(
            f"the training reported done, but its outputs are unreadable: {node_outputs}"
        )
    if MODEL not in node_outputs or REPORT not in node_outputs:
        return Verdict.mismatch(
            "the training reported done without a model and its report "
            f"(outputs: {sorted(node_outputs)})"
        )
    report = json_array(node_outputs, REPORT)
    if report is None:
        return Verdict.mismatch("the training's report_json is not a JSON object")
    evaluation = json_array(trusted_outputs, EVALUATION)
    if evaluation is None:
        return Verdict.inconclusive("the trusted node did not score the returned model")
    state = evaluation.get("model")
    if state in ("missing", "not_catboost"):
        return Verdict.mismatch(
            f"the returned model_cbm is no CatBoost model ({evaluation.get('problem')})",
            evaluation=evaluation,
        )
    if state != "loaded":
        return Verdict.inconclusive(
            f"the trusted node could not load the returned model ({evaluation.get('problem')})",
            evaluation=evaluation,
        )
    problems = _structure(report, evaluation) + _importances(node_outputs, evaluation, tol)
    problems += _metrics(report, evaluation, tol)
    details = {"evaluation": evaluation, "reported_metrics": report.get("metrics")}
    if problems:
        return Verdict.mismatch("; ".join(problems), **details)
    return Verdict.match("the returned model scores as the training reported", **details)


def _structure(report: dict[str, Any], evaluation: dict[str, Any]) -> list[str]:
    problems = []
    trees, reported = evaluation.get("trees"), report.get("iterations")
    if trees != reported:
        problems.append(f"the report says {reported} trees, the model has {trees}")
    expected = evaluation.get("expected_trees")
    if isinstance(expected, int) and trees != expected:
        problems.append(
            f"the config asks for {expected} trees with nothing to stop early, the model has "
            f"{trees}"
        )
    differing = evaluation.get("params_differing")
    if isinstance(differing, dict) and differing:
        problems.append(
            "the model was trained with other parameters than the config's: "
            + ", ".join(f"{k} {v}" for k, v in sorted(differing.items()))
        )
    return problems


def _importances(
    node_outputs: Mapping[str, Array], evaluation: dict[str, Any], tol: Tolerances
) -> list[str]:
    measured = evaluation.get("feature_importances")
    reported = node_outputs.get("feature_importances")
    if not isinstance(measured, list) or reported is None:
        return []
    values = [_number(v) for v in measured]
    if reported.ndim != 1 or reported.dtype.kind != "f" or len(values) != reported.size:
        return [f"the feature importances hold {reported.size} values, the model {len(values)}"]
    scale = max((abs(v) for v in values if v is not None), default=0.0)
    for n, (mine, theirs) in enumerate(zip(values, reported.tolist(), strict=True)):
        if mine is None:
            continue
        if not math.isfinite(theirs) or abs(mine - theirs) > tol.metric_rtol * scale + 1e-9:
            return [f"feature importance {n} is {theirs}, the model's {mine}"]
    return []


def _metrics(report: dict[str, Any], evaluation: dict[str, Any], tol: Tolerances) -> list[str]:
    measured = evaluation.get("metrics")
    reported = report.get("metrics")
    if not isinstance(measured, dict):
        return []
    if not isinstance(reported, dict):
        return ["the report holds no metrics"]
    problems = []
    for split, values in sorted(measured.items()):
        if not isinstance(values, dict):
            continue
        found = reported.get(split)
        said: dict[str, Any] = found if isinstance(found, dict) else {}
        for metric, value in sorted(values.items()):
            mine, theirs = _number(value), _number(said.get(metric))
            if mine is None or theirs is None:
                continue  # the trusted node scores only what the report gives as a number
            if not _close(mine, theirs, tol.metric_rtol):
                problems.append(
                    f"the report's {split} {metric} is {said.get(metric)}, the model scores {mine}"
                )
    return problems
