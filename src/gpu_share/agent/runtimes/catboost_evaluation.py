"""Scoring the model another node returned for the same training: the trusted node's half
of a CatBoost spot check (docs/trust.md).

Only the coordinator asks for it (`LeasedJob.evaluate`, for check jobs it queued; the
agent passes the file as `options.evaluate`), and the job trains as usual first: the
tenant gets this training's model should the other node be caught. Then the other
node's `outputs.npz` is read with the shared NPZ reader (it comes from a stranger) and
its model loaded, and the runtime measures what a model shows of itself on the same
data and split: its trees, the parameters it was trained with, its feature importances
and, on the eval set, each deterministic metric the other node's report gives a value
for. The coordinator compares them with that report (`trust/training_comparison.py`).

The measurements go into `evaluation_json` (UTF-8 JSON, as `report_json`), and the raw
predictions of the returned model on the eval set (or the train set) into
`evaluated_predictions`, for the evidence. Nothing in here fails the job: a returned
file that is no model is a finding, not an error.
"""

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from gpu_share.agent.runtimes.catboost_config import TrainConfig
from gpu_share.agent.runtimes.catboost_data import TrainingData
from gpu_share.agent.runtimes.catboost_report import catboost_message
from gpu_share.agent.runtimes.npz import Array, NpzError, load_npz
from gpu_share.agent.runtimes.runner import log

CBM_MAGIC = b"CBM1"
# Metrics whose value on a given model and data is arithmetic on its predictions, the same
# on any machine; the learn-set values of ordered boosting, or ranking metrics that break
# ties at random, are not among them.
DETERMINISTIC = frozenset(
    {
        "RMSE",
        "MAE",
        "MAPE",
        "Quantile",
        "Poisson",
        "Logloss",
        "CrossEntropy",
        "MultiClass",
        "MultiClassOneVsAll",
        "MultiRMSE",
    }
)
CHECKED_PARAMS = ("depth", "learning_rate", "l2_leaf_reg")
EARLY_STOPPING = ("od_type", "od_wait", "od_pval")


def evaluated_outputs(
    path: Path,
    config: TrainConfig,
    data: TrainingData,
    pools: tuple[Any, Any],
    catboost: Any,
    max_bytes: int | None,
) -> dict[str, Array]:
    """`evaluation_json` (and `evaluated_predictions` when the model loads) to add to the
    outputs. `pools`: the train and eval pools of this job (eval may be None)."""
    evaluation, predictions = evaluate(path, config, data, pools, catboost, max_bytes)
    log(
        f"spot check: the returned model is {evaluation['model']}"
        + (f" ({evaluation['problem']})" if evaluation.get("problem") else "")
    )
    text = json.dumps(evaluation, allow_nan=False)
    outputs: dict[str, Array] = {"evaluation_json": np.frombuffer(text.encode(), dtype=np.uint8)}
    if predictions is not None:
        outputs["evaluated_predictions"] = predictions
    return outputs


def evaluate(
    path: Path,
    config: TrainConfig,
    data: TrainingData,
    pools: tuple[Any, Any],
    catboost: Any,
    max_bytes: int | None,
) -> tuple[dict[str, Any], Array | None]:
    if not path.is_file():  # the agent could not fetch it: nothing is known of the model
        return {"model": "unavailable", "problem": "the returned outputs could not be had"}, None
    try:
        arrays = load_npz(path, max_bytes=max_bytes)
    except NpzError as exc:
        return {"model": "missing", "problem": f"the returned outputs are no NPZ: {exc}"}, None
    blob = arrays.get("model_cbm")
    if blob is None or blob.dtype != np.uint8 or blob.ndim != 1:
        return {"model": "missing", "problem": "the returned outputs hold no model_cbm"}, None
    raw = blob.tobytes()
    if not raw.startswith(CBM_MAGIC):
        return {"model": "not_catboost", "problem": "model_cbm is not a CatBoost model file"}, None
    model = catboost.CatBoost()
    try:
        model.load_model(blob=raw)
    except Exception as exc:  # another CatBoost's file, or a broken one: inconclusive
        return {"model": "unloadable", "problem": catboost_message(exc)}, None
    train_pool, eval_pool = pools
    trees = int(model.tree_count_)
    evaluation: dict[str, Any] = {
        "model": "loaded",
        "trees": trees,
        "expected_trees": expected_trees(config, data),
        "params_differing": params_differing(config, model),
        "feature_importances": _importances(model),
        "metrics": {},
    }
    reported = _reported_eval_metrics(arrays)
    if eval_pool is not None and reported and trees > 0:
        evaluation["metrics"]["eval"] = _scores(model, eval_pool, reported, trees)
    scored = eval_pool if eval_pool is not None else train_pool
    try:
        predictions = np.asarray(model.predict(scored, prediction_type="RawFormulaVal"))
    except Exception as exc:
        evaluation["problem"] = f"predicting failed: {catboost_message(exc)}"
        predictions = None
    return evaluation, None if predictions is None else predictions.astype(np.float64)


def expected_trees(config: TrainConfig, data: TrainingData) -> int | None:
    """How many trees the model must have, when nothing could have stopped it early: no
    overfitting detector, and no eval set whose best iteration it shrinks to."""
    extras = config.model_extra or {}
    if config.early_stopping_rounds is not None or any(k in extras for k in EARLY_STOPPING):
        return None
    if data.eval is not None and extras.get("use_best_model", True) is not False:
        return None
    return config.iterations


def params_differing(config: TrainConfig, model: Any) -> dict[str, list[Any]]:
    """The parameters the tenant set that the model says it was trained with otherwise."""
    try:
        actual = model.get_all_params()
    except Exception:
        return {}
    differing = {}
    for name in CHECKED_PARAMS:
        wanted, got = getattr(config, name), actual.get(name)
        if wanted is None or not isinstance(got, int | float):
            continue
        if not math.isclose(float(wanted), float(got), rel_tol=1e-6, abs_tol=1e-12):
            differing[name] = [wanted, got]
    return differing


def _importances(model: Any) -> list[float | None] | None:
    try:
        values = model.get_feature_importance(type="PredictionValuesChange")
    except Exception:
        return None
    return [float(v) if math.isfinite(float(v)) else None for v in values]


def _reported_eval_metrics(arrays: dict[str, Array]) -> list[str]:
    """The deterministic metrics the returned report gives an eval-set number for."""
    report = arrays.get("report_json")
    if report is None or report.dtype != np.uint8:
        return []
    try:
        parsed = json.loads(report.tobytes().decode())
        values = parsed["metrics"]["eval"]
    except (UnicodeDecodeError, ValueError, KeyError, TypeError):
        return []
    if not isinstance(values, dict):
        return []
    return sorted(
        str(name)
        for name, value in values.items()
        if str(name).split(":", 1)[0] in DETERMINISTIC
        and isinstance(value, int | float)
        and not isinstance(value, bool)
    )


def _scores(model: Any, pool: Any, names: list[str], trees: int) -> dict[str, float | None]:
    try:
        curves = model.eval_metrics(
            pool, metrics=names, ntree_start=0, ntree_end=trees, eval_period=trees
        )
    except Exception as exc:
        log(f"spot check: scoring the returned model failed: {catboost_message(exc)}")
        return {}
    scores: dict[str, float | None] = {}
    for name in names:
        values = curves.get(name)
        if values:
            value = float(values[-1])
            scores[name] = value if math.isfinite(value) else None
    return scores
