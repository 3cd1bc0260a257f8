"""`train_catboost`: CatBoost training as one call, on the platform's catboost runtimes.

The contract with the runtime (SPEC §1.6): the config artifact (kind `config`) is a
JSON object of CatBoost parameters plus `task`, `cat_features`, `feature_names`,
`eval_fraction` and `outputs`; the inputs artifact is an NPZ of `X`, `y` and
optionally `X_eval`, `y_eval`, `group_id`, `weight`. The job's outputs NPZ holds
the model as bytes (`model_cbm`, `model_onnx`, `model_json`: uint8 arrays) and a
`report_json` (uint8, UTF-8 JSON) with metrics, learning curves and importances.

numpy and catboost are imported here only, when a training is built or loaded; both
are checked before anything is uploaded, so a missing extra never costs a training.
"""

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from gpu_share.protocol.artifacts import ArtifactKind
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.invokes import Invoke
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.sdk import _api, _npz
from gpu_share.sdk._config import ClientConfig
from gpu_share.sdk._http import Flow, Offload
from gpu_share.sdk._results import InvokeOutputs
from gpu_share.sdk.errors import ConfigurationError, GpuShareError, api_error

if TYPE_CHECKING:
    from gpu_share.sdk._npz import Array

TASKS = ("classification", "regression", "ranking")
MODEL_FORMATS = ("cbm", "onnx", "json")
DEFAULT_TRAIN_TIMEOUT_SEC = 3600

_RANKING_LOSSES = {
    "YetiRank",
    "YetiRankPairwise",
    "PairLogit",
    "PairLogitPairwise",
    "QueryRMSE",
    "QuerySoftMax",
    "QueryCrossEntropy",
    "StochasticFilter",
    "StochasticRank",
    "LambdaMart",
}
_CLASSIFICATION_LOSSES = {
    "Logloss",
    "CrossEntropy",
    "MultiClass",
    "MultiClassOneVsAll",
    "MultiLogloss",
    "MultiCrossEntropy",
}
# The runtime chooses the device from the runtime name; a params key saying otherwise
# would be a contradiction the tenant should hear about before paying for a GPU.
_DEVICE_KEYS = ("task_type", "devices", "device_config")
_SPECIAL_KEYS = ("task", "cat_features", "feature_names", "eval_fraction", "outputs")


def _invalid(message: str) -> GpuShareError:
    return api_error(None, ErrorCode.VALIDATION_ERROR, message)


def infer_task(params: Mapping[str, Any], y: "Array", has_groups: bool) -> str:
    """From the loss when there is one; else groups mean ranking, float targets regression."""
    loss = str(params.get("loss_function") or "").split(":")[0]
    if loss in _RANKING_LOSSES:
        return "ranking"
    if loss in _CLASSIFICATION_LOSSES:
        return "classification"
    if loss:
        return "regression"
    if has_groups:
        return "ranking"
    return "regression" if y.dtype.kind == "f" else "classification"


@dataclass(frozen=True)
class TrainingRequest:
    runtime: RuntimeName
    task: str
    config: bytes
    inputs: bytes


def _matrix(np: Any, X: Any, what: str) -> tuple["Array", list[str] | None]:
    names = [str(c) for c in X.columns] if hasattr(X, "columns") else None
    array = np.asarray(X.to_numpy() if hasattr(X, "to_numpy") else X)
    if array.ndim != 2:
        raise _invalid(f"{what}: must be 2-D (rows × features), got shape {list(array.shape)}")
    if array.dtype.kind == "O":
        try:
            array = array.astype(np.float64)
        except (TypeError, ValueError):
            array = array.astype(str)  # categorical strings: NPZ holds them without pickling
    return array, names


def _vector(np: Any, values: Any, what: str, rows: int) -> "Array":
    array: Array = np.asarray(values.to_numpy() if hasattr(values, "to_numpy") else values)
    if array.ndim == 2 and array.shape[1] == 1:
        array = array[:, 0]
    if array.shape[0] != rows:
        raise _invalid(f"{what}: has {array.shape[0]} rows, X has {rows}")
    if array.dtype.kind == "O":
        array = array.astype(str)
    return array


def build_training(
    X: Any,
    y: Any,
    params: Mapping[str, Any] | None,
    *,
    eval_set: tuple[Any, ...] | None = None,
    cat_features: Sequence[int | str] | None = None,
    gpu: bool = True,
    task: str | None = None,
    group_id: Any = None,
    weight: Any = None,
    feature_names: Sequence[str] | None = None,
    eval_fraction: float | None = None,
    outputs: Sequence[str] = ("cbm",),
) -> TrainingRequest:
    """The config JSON and inputs NPZ of one training; refuses what the runtime would."""
    np = _npz.require_numpy("train_catboost")
    params = dict(params or {})
    for key in _DEVICE_KEYS:
        if key in params:
            raise _invalid(f"params.{key}: the platform sets it; choose the device with gpu=")
    for key in _SPECIAL_KEYS:
        if key in params:
            raise _invalid(f"params.{key}: pass it as the train_catboost argument {key}=")
    features, column_names = _matrix(np, X, "X")
    rows, columns = features.shape
    arrays: dict[str, Any] = {"X": features, "y": _vector(np, y, "y", rows)}
    if eval_set is not None:
        if len(eval_set) not in (2, 3):
            raise _invalid("eval_set: give (X_eval, y_eval), or (X_eval, y_eval, group_id_eval)")
        X_eval, y_eval = eval_set[0], eval_set[1]
        eval_features, _ = _matrix(np, X_eval, "eval_set X")
        if eval_features.shape[1] != columns:
            raise _invalid(f"eval_set X: has {eval_features.shape[1]} features, X has {columns}")
        arrays["X_eval"] = eval_features
        arrays["y_eval"] = _vector(np, y_eval, "eval_set y", eval_features.shape[0])
        if len(eval_set) == 3:
            arrays["group_id_eval"] = _vector(
                np, eval_set[2], "eval_set group_id", eval_features.shape[0]
            )
        elif group_id is not None:
            raise _invalid(
                "eval_set: ranking needs the eval groups: (X_eval, y_eval, group_id_eval)"
            )
    if group_id is not None:
        arrays["group_id"] = _vector(np, group_id, "group_id", rows)
    if weight is not None:
        arrays["weight"] = _vector(np, weight, "weight", rows).astype(np.float64)

    names = list(feature_names) if feature_names is not None else column_names
    if names is not None and len(names) != columns:
        raise _invalid(f"feature_names: {len(names)} names for {columns} features")
    task = task or infer_task(params, arrays["y"], group_id is not None)
    if task not in TASKS:
        raise _invalid(f"task: must be one of {', '.join(TASKS)}")
    formats = list(outputs)
    if not formats or any(f not in MODEL_FORMATS for f in formats):
        raise _invalid(f"outputs: a non-empty subset of {', '.join(MODEL_FORMATS)}")
    config: dict[str, Any] = {**params, "task": task, "outputs": formats}
    if cat_features:
        config["cat_features"] = _column_indices(cat_features, names, columns)
    if names is not None:
        config["feature_names"] = names
    if eval_fraction is not None:
        if eval_set is not None:
            raise _invalid("eval_fraction: give either eval_set or eval_fraction, not both")
        if not 0 < eval_fraction < 1:
            raise _invalid("eval_fraction: must be between 0 and 1")
        config["eval_fraction"] = eval_fraction
    try:
        config_bytes = json.dumps(config, sort_keys=True, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise _invalid(f"params: must be JSON-serializable CatBoost parameters ({exc})") from None
    return TrainingRequest(
        runtime=RuntimeName.CATBOOST_CUDA if gpu else RuntimeName.CATBOOST_CPU,
        task=task,
        config=config_bytes,
        inputs=_npz.encode(arrays, field="X/y"),
    )


def _column_indices(
    cat_features: Sequence[int | str], names: list[str] | None, columns: int
) -> list[int]:
    indices = []
    for feature in cat_features:
        if isinstance(feature, str):
            if names is None or feature not in names:
                raise _invalid(f"cat_features: {feature!r} is not a feature name")
            indices.append(names.index(feature))
        elif not 0 <= int(feature) < columns:
            raise _invalid(f"cat_features: column {feature} is out of range (0..{columns - 1})")
        else:
            indices.append(int(feature))
    return indices


@dataclass
class TrainingReport:
    """What the runtime reported about the training, and the invoke that ran it."""

    metrics: dict[str, Any]
    learning_curves: dict[str, Any]
    feature_importances: "Array | list[float]"
    iterations: int | None
    best_iteration: int | None
    raw: dict[str, Any]
    invoke: Invoke
    model_cbm: bytes = field(repr=False)
    model_onnx: bytes | None = field(default=None, repr=False)
    model_json: bytes | None = field(default=None, repr=False)


class TrainedModel(NamedTuple):
    """`model, report = client.train_catboost(...)`."""

    model: Any  # catboost.CatBoostClassifier | CatBoostRegressor | CatBoost; None: not loaded
    report: TrainingReport


def _require_catboost() -> Any:
    try:
        import catboost
    except ImportError:
        raise ConfigurationError(
            "train_catboost loads the trained model with catboost, which is not installed: "
            "pip install 'gpu-share[catboost]'; or pass load_model=False to get the model's "
            "bytes (report.model_cbm) and metrics without it"
        ) from None
    return catboost


def _loaded(cbm: bytes, task: str) -> Any:
    catboost = _require_catboost()
    model_class = {
        "classification": catboost.CatBoostClassifier,
        "regression": catboost.CatBoostRegressor,
    }.get(task, catboost.CatBoost)
    model = model_class()
    model.load_model(blob=cbm)
    return model


def load_training(outputs: InvokeOutputs, task: str, *, load_model: bool = True) -> TrainedModel:
    """The report and the trained model (loaded, or None) from a training invoke's outputs."""
    arrays = outputs.arrays
    if "model_cbm" not in arrays or "report_json" not in arrays:
        raise GpuShareError(
            f"invoke {outputs.invoke.id} returned {sorted(arrays)}, not a CatBoost training "
            "result (model_cbm, report_json)"
        )
    cbm = _npz.array_bytes(arrays["model_cbm"])
    model = _loaded(cbm, task) if load_model else None
    raw = json.loads(_npz.array_bytes(arrays["report_json"]).decode("utf-8"))
    importances = arrays.get("feature_importances")
    report = TrainingReport(
        metrics=raw.get("metrics", {}),
        learning_curves=raw.get("learning_curves", {}),
        feature_importances=(
            importances if importances is not None else raw.get("feature_importances", [])
        ),
        iterations=raw.get("iterations"),
        best_iteration=raw.get("best_iteration"),
        raw=raw,
        invoke=outputs.invoke,
        model_cbm=cbm,
        model_onnx=_npz.array_bytes(arrays["model_onnx"]) if "model_onnx" in arrays else None,
        model_json=_npz.array_bytes(arrays["model_json"]) if "model_json" in arrays else None,
    )
    return TrainedModel(model, report)


def train_catboost(
    c: ClientConfig,
    X: Any,
    y: Any,
    params: Mapping[str, Any] | None,
    *,
    eval_set: tuple[Any, ...] | None = None,
    cat_features: Sequence[int | str] | None = None,
    gpu: bool = True,
    task: str | None = None,
    group_id: Any = None,
    weight: Any = None,
    feature_names: Sequence[str] | None = None,
    eval_fraction: float | None = None,
    outputs: Sequence[str] = ("cbm",),
    wait_timeout: float | None = None,
    load_model: bool = True,
    options: _api.InvokeOptions | None = None,
) -> Flow[TrainedModel]:
    if load_model:  # a training whose model cannot be loaded here is a training wasted
        yield Offload(_require_catboost)
    request: TrainingRequest = yield Offload(
        lambda: build_training(
            X,
            y,
            params,
            eval_set=eval_set,
            cat_features=cat_features,
            gpu=gpu,
            task=task,
            group_id=group_id,
            weight=weight,
            feature_names=feature_names,
            eval_fraction=eval_fraction,
            outputs=outputs,
        )
    )
    config = yield from _api.upload_artifact(c, request.config, ArtifactKind.CONFIG, name="config")
    inputs = yield from _api.upload_artifact(c, request.inputs, ArtifactKind.INPUTS, name="X/y")
    invoke_options = _api.InvokeOptions(**(options or {}))
    invoke_options.setdefault("timeout_sec", DEFAULT_TRAIN_TIMEOUT_SEC)
    invoke_options["model_checksum_sha256"] = config.sha256
    invoke_options["inputs_checksum_sha256"] = inputs.sha256
    result = yield from _api.invoke_and_wait(
        c, request.runtime, config.url, inputs.url, invoke_options, wait_timeout=wait_timeout
    )
    trained: TrainedModel = yield Offload(
        lambda: load_training(result, request.task, load_model=load_model)
    )
    return trained
