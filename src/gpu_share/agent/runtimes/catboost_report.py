"""What a finished CatBoost training gives back: the arrays of `outputs.npz`.

`model_cbm` (always), `model_onnx` and `model_json` (when the config's `outputs` asks):
the files' bytes as uint8. An ONNX or JSON export that fails after training is logged
and named in the report's `export_errors` rather than failing the job, which would
lose the model.
`feature_importances`: float64, one per feature (`PredictionValuesChange`).
`report_json`: UTF-8 JSON with task, device, the effective params, `iterations`
(trees in the final model), `best_iteration`, `metrics` (train/eval values of the
final model), `learning_curves` (train/eval, per metric), feature names and
importances, `resumed` and `iterations_run_this_attempt`.
"""

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from gpu_share.agent.runtimes.catboost_config import TrainConfig
from gpu_share.agent.runtimes.catboost_data import TrainingData
from gpu_share.agent.runtimes.npz import Array
from gpu_share.agent.runtimes.runner import log

FEATURE_IMPORTANCE_TYPE = "PredictionValuesChange"  # needs no data, works for every task
INTERNAL_PARAMS = {"train_dir", "save_snapshot", "snapshot_file", "snapshot_interval"}
INTERNAL_PARAMS |= {"allow_writing_files", "verbose", "logging_level", "metric_period"}
SOURCE_PREFIX = re.compile(r"(?:[\w./-]+\.(?:cpp|h|pyx):\d+: )+")
MAX_MESSAGE_CHARS = 1500


def training_outputs(
    model: Any,
    config: TrainConfig,
    data: TrainingData,
    train_pool: Any,
    *,
    first: int | None,
    last: int | None,
    from_snapshot: bool,
    scratch: Path,
) -> tuple[dict[str, Array], dict[str, Any]]:
    """The arrays of `outputs.npz` (`report_json` included) and the report itself.

    `first` and `last` are the first and last iterations this process logged, `None`
    when it ran none; `from_snapshot` says CatBoost was given a snapshot to go on from.
    """
    outputs: dict[str, Array] = {}
    export_errors: dict[str, str] = {}
    model.save_model(str(scratch / "model.cbm"))  # always: the model itself
    outputs["model_cbm"] = np.frombuffer((scratch / "model.cbm").read_bytes(), dtype=np.uint8)
    for kind in config.outputs:
        if kind == "cbm":
            continue
        path = scratch / f"model.{kind}"
        try:
            model.save_model(str(path), format=kind, pool=train_pool if kind == "json" else None)
        except Exception as exc:  # the model is trained; an export failure must not lose it
            export_errors[kind] = catboost_message(exc)
            log(f"the {kind} export failed: {export_errors[kind]}")
            continue
        outputs[f"model_{kind}"] = np.frombuffer(path.read_bytes(), dtype=np.uint8)

    importances = np.asarray(
        model.get_feature_importance(type=FEATURE_IMPORTANCE_TYPE), dtype=np.float64
    )
    outputs["feature_importances"] = importances
    trees = int(model.tree_count_)
    curves = {
        ("train" if name == "learn" else "eval"): {
            metric: [_number(v) for v in values] for metric, values in metrics.items()
        }
        for name, metrics in model.get_evals_result().items()
    }
    period = config.metric_period or 1
    longest = max((len(v) for c in curves.values() for v in c.values()), default=0)
    # Iterations trained before any shrink to the best one; when this process ran none
    # (it went on from a final snapshot), the curves restored from it tell.
    trained = last + 1 if last is not None else (longest if period == 1 else trees)
    best = model.get_best_iteration()
    resumed = (first or 0) > 0 or (from_snapshot and first is None)
    all_params = model.get_all_params()
    report: dict[str, Any] = {
        "task": config.task,
        "device": "cuda" if all_params.get("task_type") == "GPU" else "cpu",
        "params": {k: v for k, v in all_params.items() if k not in INTERNAL_PARAMS},
        "iterations": trees,
        "best_iteration": None if best is None else int(best),
        "metric_period": period,
        "metrics": {
            split: {metric: _final(values, trees, trained, period) for metric, values in c.items()}
            for split, c in curves.items()
        },
        "learning_curves": curves,
        "feature_names": list(model.feature_names_),
        "feature_importances": importances.tolist(),
        "feature_importance_type": FEATURE_IMPORTANCE_TYPE,
        "cat_features": data.cat_features,
        "eval_source": data.eval_source,
        "resumed": resumed,
        "iterations_run_this_attempt": (0 if first is None or last is None else last - first + 1),
    }
    if export_errors:
        report["export_errors"] = export_errors
    outputs["report_json"] = _json_bytes(report)
    return outputs, report


def _final(values: list[float | None], trees: int, trained: int, period: int) -> float | None:
    """A curve's value for the final model (the one at its last tree).

    A curve holds every iteration, or with `metric_period` p > 1 iterations 0, p, 2p, …
    (CatBoost still computes the eval metric at every iteration when early stopping is
    on); then it is the value at the last computed iteration up to the final tree.
    """
    if not values:
        return None
    if len(values) >= trained:  # one value per iteration
        return values[min(trees, len(values)) - 1]
    if trees >= trained:
        return values[-1]
    return values[min((trees - 1) // period, len(values) - 1)]


def _number(value: Any) -> float | None:
    number = float(value)
    return number if math.isfinite(number) else None


def _json_bytes(report: dict[str, Any]) -> Array:
    text = json.dumps(_jsonable(report), allow_nan=False)
    return np.frombuffer(text.encode(), dtype=np.uint8)


def _jsonable(value: Any) -> Any:
    """Plain JSON: NaN and infinities (which JSON lacks) become null, numpy values Python's."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | np.ndarray):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def catboost_message(exc: BaseException) -> str:
    message = SOURCE_PREFIX.sub("", str(exc)).strip() or type(exc).__name__
    return message if len(message) <= MAX_MESSAGE_CHARS else message[:MAX_MESSAGE_CHARS] + "…"
