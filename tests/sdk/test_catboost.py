"""`train_catboost`'s two ends without a server: the request it builds (config JSON +
inputs NPZ, the runtime contract of SPEC §1.6) and the result it decodes (a real
CatBoost model trained here, packed the way the runtime packs it)."""

import io
import json
from pathlib import Path
from typing import Any

import catboost
import numpy as np
import pytest

from gpu_share.protocol.invokes import Invoke
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.sdk import GpuShareError, ValidationError
from gpu_share.sdk._catboost import build_training, infer_task, load_training
from gpu_share.sdk._npz import decode, encode
from gpu_share.sdk._results import InvokeOutputs

RNG = np.random.default_rng(7)
X = RNG.normal(size=(120, 3))
Y_CLASS = (X[:, 0] > 0).astype(np.int64)
Y_REG = X[:, 0] * 2.0 + X[:, 1]


def npz(data: bytes) -> dict[str, Any]:
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def test_the_request_is_a_config_of_params_and_special_keys_and_an_npz_of_x_and_y() -> None:
    request = build_training(
        X,
        Y_CLASS,
        {"iterations": 20, "learning_rate": 0.1, "depth": 3, "eval_metric": "AUC"},
        eval_set=(X[:30], Y_CLASS[:30]),
        cat_features=None,
        gpu=True,
        weight=np.ones(len(X)),
        outputs=["cbm", "onnx"],
    )
    assert request.runtime is RuntimeName.CATBOOST_CUDA and request.task == "classification"
    config = json.loads(request.config)
    assert config == {
        "iterations": 20,
        "learning_rate": 0.1,
        "depth": 3,
        "eval_metric": "AUC",
        "task": "classification",
        "outputs": ["cbm", "onnx"],
    }
    arrays = npz(request.inputs)
    assert set(arrays) == {"X", "y", "X_eval", "y_eval", "weight"}
    np.testing.assert_array_equal(arrays["X"], X)
    assert arrays["y"].dtype == np.int64 and arrays["X_eval"].shape == (30, 3)


def test_a_dataframe_gives_feature_names_and_categorical_columns_by_name() -> None:
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"size": [1.0, 2.0, 3.0], "color": ["red", "blue", "red"]})
    request = build_training(
        frame, [0, 1, 0], {"iterations": 5}, cat_features=["color"], gpu=False, eval_fraction=0.2
    )
    config = json.loads(request.config)
    assert request.runtime is RuntimeName.CATBOOST_CPU
    assert (config["feature_names"], config["cat_features"]) == (["size", "color"], [1])
    assert config["eval_fraction"] == 0.2
    features = npz(request.inputs)["X"]
    assert features.dtype.kind == "U" and features.tolist()[1] == ["2.0", "blue"]


@pytest.mark.parametrize(
    ("params", "y", "groups", "task"),
    [
        ({"loss_function": "RMSE"}, Y_CLASS, False, "regression"),
        ({"loss_function": "MultiClass"}, Y_REG, False, "classification"),
        ({"loss_function": "YetiRank"}, Y_REG, False, "ranking"),
        ({"loss_function": "Quantile:alpha=0.9"}, Y_CLASS, False, "regression"),
        ({}, Y_REG, False, "regression"),
        ({}, Y_CLASS, False, "classification"),
        ({}, Y_REG, True, "ranking"),
    ],
)
def test_the_task_follows_the_loss_then_the_data(
    params: dict[str, Any], y: Any, groups: bool, task: str
) -> None:
    assert infer_task(params, np.asarray(y), groups) == task


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"params": {"task_type": "GPU"}}, "params.task_type: the platform sets it"),
        ({"params": {"task": "regression"}}, "pass it as the train_catboost argument task="),
        ({"y": Y_CLASS[:10]}, "y: has 10 rows, X has 120"),
        ({"X": X[:, 0]}, "X: must be 2-D"),
        ({"cat_features": [5]}, "cat_features: column 5 is out of range"),
        ({"cat_features": ["color"]}, "'color' is not a feature name"),
        ({"outputs": ["pmml"]}, "outputs: a non-empty subset"),
        ({"task": "clustering"}, "task: must be one of"),
        ({"eval_set": (X, Y_CLASS), "eval_fraction": 0.1}, "either eval_set or eval_fraction"),
        ({"params": {"iterations": object()}}, "JSON-serializable"),
    ],
)
def test_what_the_runtime_would_refuse_is_refused_before_anything_is_sent(
    kwargs: dict[str, Any], message: str
) -> None:
    arguments: dict[str, Any] = {"X": X, "y": Y_CLASS, "params": {}, **kwargs}
    with pytest.raises(ValidationError, match=message) as caught:
        build_training(arguments.pop("X"), arguments.pop("y"), arguments.pop("params"), **arguments)
    assert caught.value.status is None


def runtime_outputs(
    model: Any, task: str, scratch: Path, extra: dict[str, Any] | None = None
) -> bytes:
    """An outputs NPZ as the catboost runtime writes it."""
    report = {
        "task": task,
        "iterations": model.tree_count_,
        "best_iteration": model.get_best_iteration(),
        "metrics": {"train": {"RMSE": 0.5}, "eval": {"RMSE": 0.6}},
        "learning_curves": {"train": {"RMSE": [0.9, 0.5]}},
        "feature_importances": [1.0, 2.0, 3.0],
    }
    model.save_model(str(scratch / "model.cbm"))
    return encode(
        {
            "model_cbm": np.frombuffer((scratch / "model.cbm").read_bytes(), dtype=np.uint8),
            "report_json": np.frombuffer(json.dumps(report).encode(), dtype=np.uint8),
            "feature_importances": np.array([1.0, 2.0, 3.0]),
            **(extra or {}),
        }
    )


def done_invoke(runtime: str = "catboost_cpu") -> Invoke:
    return Invoke.model_validate(
        {
            "id": "inv_train",
            "status": "done",
            "runtime": runtime,
            "model_url": "https://x.example/config.json",
            "inputs_url": "https://x.example/inputs.npz",
            "timeout_sec": 600,
            "priority": "on_demand",
            "node_id": "nod_1",
            "attempts": 1,
            "created_at": "2026-01-01T00:00:00Z",
            "assigned_at": None,
            "started_at": None,
            "finished_at": None,
            "result": {"metrics": {"device": "cpu", "duration_ms": 10}},
            "error": None,
        }
    )


@pytest.mark.parametrize(
    ("task", "cls", "y"),
    [
        ("regression", catboost.CatBoostRegressor, Y_REG),
        ("classification", catboost.CatBoostClassifier, Y_CLASS),
    ],
)
def test_the_result_decodes_to_a_loaded_model_of_the_tasks_class_and_its_report(
    task: str, cls: Any, y: Any, tmp_path: Path
) -> None:
    trained = cls(iterations=10, depth=2, verbose=False, allow_writing_files=False).fit(X, y)
    outputs = InvokeOutputs(done_invoke(), runtime_outputs(trained, task, tmp_path))
    model, report = load_training(outputs, task)
    assert type(model) is cls
    np.testing.assert_allclose(model.predict(X[:5]), trained.predict(X[:5]))
    assert report.metrics["eval"] == {"RMSE": 0.6}
    assert report.iterations == 10 and report.invoke.id == "inv_train"
    np.testing.assert_array_equal(report.feature_importances, [1.0, 2.0, 3.0])
    assert report.model_onnx is None


def test_a_ranking_result_is_a_plain_catboost_model_with_its_extra_exports(tmp_path: Path) -> None:
    trained = catboost.CatBoostRegressor(iterations=5, verbose=False, allow_writing_files=False)
    trained.fit(X, Y_REG)
    extra = {"model_json": np.frombuffer(b'{"trees": []}', dtype=np.uint8)}
    model, report = load_training(
        InvokeOutputs(done_invoke(), runtime_outputs(trained, "ranking", tmp_path, extra)),
        "ranking",
    )
    assert type(model) is catboost.CatBoost
    assert report.model_json == b'{"trees": []}'


def test_outputs_that_are_not_a_training_result_say_so() -> None:
    outputs = InvokeOutputs(done_invoke(), encode({"label": np.arange(3)}))
    with pytest.raises(GpuShareError, match="not a CatBoost training result"):
        load_training(outputs, "regression")


def test_npz_encoding_keeps_any_name_and_refuses_pickles() -> None:
    arrays = decode(encode({"file": np.arange(3), "allow_pickle": np.ones(2)}))
    assert set(arrays) == {"file", "allow_pickle"}
    assert decode(encode(np.arange(4)))["arr_0"].tolist() == [0, 1, 2, 3]
    with pytest.raises(ValidationError, match="dtype object"):
        encode({"x": np.array([{"a": 1}], dtype=object)})


def test_a_ranking_eval_set_carries_its_groups() -> None:
    groups = np.repeat(np.arange(len(X) // 5), 5)[: len(X)]
    request = build_training(
        X,
        np.arange(len(X)) % 3,
        {"loss_function": "YetiRank", "iterations": 5},
        eval_set=(X[:20], np.arange(20) % 3, groups[:20]),
        group_id=groups,
    )
    assert request.task == "ranking"
    arrays = npz(request.inputs)
    np.testing.assert_array_equal(arrays["group_id_eval"], groups[:20])
    with pytest.raises(ValidationError, match="eval groups"):
        build_training(
            X,
            np.arange(len(X)) % 3,
            {"loss_function": "YetiRank"},
            eval_set=(X[:20], np.arange(20) % 3),
            group_id=groups,
        )
