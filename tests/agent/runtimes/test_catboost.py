"""The CatBoost train runtime as the agent runs it: a real process in a job directory.

Trainings go through `python -m gpu_share.agent.runtimes.catboost spec.json` and are
judged by `result.json` and `out/outputs.npz`, as the agent judges them; the matrix
of bad configs and inputs calls the same `main` in-process, to stay fast.
"""

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from catboost import CatBoost, CatBoostClassifier, CatBoostRanker, CatBoostRegressor
from catboost.utils import get_gpu_device_count
from sklearn.datasets import load_breast_cancer, load_diabetes, load_iris

from gpu_share.agent.runtimes import catboost as runtime
from gpu_share.agent.runtimes.catboost_config import (
    ALIASES,
    CATBOOST_PARAMS,
    CONFIG_KEYS,
    IGNORED,
    REFUSED,
    REPLACED,
)
from gpu_share.agent.runtimes.jobspec import RuntimeResult, read_result
from gpu_share.agent.runtimes.npz import load_npz

MODULE = "gpu_share.agent.runtimes.catboost"
THREADS = 2


@dataclass
class Job:
    directory: Path
    result: RuntimeResult
    returncode: int
    log: str

    def outputs(self) -> dict[str, Any]:
        assert self.result.outputs is not None, self.log
        return dict(load_npz(self.directory / self.result.outputs))

    def report(self) -> dict[str, Any]:
        report: dict[str, Any] = json.loads(self.outputs()["report_json"].tobytes())
        return report

    def model(self, estimator: type[CatBoost]) -> Any:
        return estimator().load_model(blob=self.outputs()["model_cbm"].tobytes())

    @property
    def error(self) -> tuple[str, str]:
        assert self.result.error is not None, self.log
        return self.result.error.code.value, self.result.error.message


def npz_bytes(**arrays: Any) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def prepare(
    directory: Path,
    config: dict[str, Any] | bytes,
    inputs: bytes | None,
    *,
    runtime_name: str = "catboost_cpu",
    options: dict[str, Any] | None = None,
) -> None:
    (directory / "in").mkdir(parents=True)
    model = config if isinstance(config, bytes) else json.dumps(config).encode()
    (directory / "in" / "model").write_bytes(model)
    if inputs is not None:
        (directory / "in" / "inputs").write_bytes(inputs)
    spec = {
        "runtime": runtime_name,
        "model": "in/model",
        "inputs": None if inputs is None else "in/inputs",
        "outputs_dir": "out",
        "threads": THREADS,
        "options": options or {},
    }
    (directory / "spec.json").write_text(json.dumps(spec))


def finish(directory: Path, returncode: int, log: str) -> Job:
    result = read_result(directory / "out" / "result.json")
    assert result is not None, log
    return Job(directory, result, returncode, log)


def run_job(
    directory: Path,
    config: dict[str, Any] | bytes,
    inputs: bytes | None,
    **kwargs: Any,
) -> Job:
    prepare(directory, config, inputs, **kwargs)
    done = subprocess.run(
        [sys.executable, "-m", MODULE, "spec.json"],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return finish(directory, done.returncode, done.stdout + done.stderr)


def run_in_process(
    directory: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    config: dict[str, Any] | bytes,
    inputs: bytes | None,
    **kwargs: Any,
) -> Job:
    prepare(directory, config, inputs, **kwargs)
    monkeypatch.chdir(directory)
    returncode = runtime.main(["spec.json"])
    captured = capsys.readouterr()
    return finish(directory, returncode, captured.out + captured.err)


def breast_cancer() -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    X, y = load_breast_cancer(return_X_y=True)
    return X, y


def diabetes() -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    X, y = load_diabetes(return_X_y=True)
    return X, y


# Determinism: the platform's model is the one local training makes


@pytest.mark.parametrize(
    ("dataset", "task", "loss", "estimator"),
    [
        pytest.param(breast_cancer, "classification", "Logloss", CatBoostClassifier, id="cancer"),
        pytest.param(diabetes, "regression", "RMSE", CatBoostRegressor, id="diabetes"),
    ],
)
def test_cpu_training_with_a_seed_predicts_exactly_like_local_training(
    tmp_path: Path, dataset: Any, task: str, loss: str, estimator: type[CatBoost]
) -> None:
    X, y = dataset()
    params = {"loss_function": loss, "iterations": 80, "depth": 5, "random_seed": 42}

    job = run_job(tmp_path, {"task": task, **params}, npz_bytes(X=X, y=y))

    assert job.returncode == 0 and job.result.ok, job.log
    local = estimator(**params, thread_count=THREADS, verbose=0, allow_writing_files=False)
    local.fit(X, y)
    trained = job.model(estimator)
    np.testing.assert_array_equal(trained.predict(X, prediction_type="RawFormulaVal"),
                                  local.predict(X, prediction_type="RawFormulaVal"))  # fmt: skip
    metrics = job.result.metrics
    assert metrics is not None and metrics.device == "cpu"
    assert metrics.extra["iterations"] == 80 and metrics.extra["threads"] == THREADS
    assert metrics.extra["resumed"] is False
    assert metrics.extra["iterations_run_this_attempt"] == 80


# What a training gives back


def test_report_holds_curves_metrics_importances_and_every_export_asked_for(
    tmp_path: Path,
) -> None:
    import onnxruntime as ort

    X, y = breast_cancer()
    config = {
        "task": "classification",
        "iterations": 40,
        "random_seed": 1,
        "eval_fraction": 0.25,
        "custom_metric": ["AUC"],
        "use_best_model": False,
        "outputs": ["cbm", "onnx", "json"],
    }

    job = run_job(tmp_path, config, npz_bytes(X=X.astype(np.float32), y=y))

    assert job.result.ok, job.log
    outputs = job.outputs()
    assert set(outputs) == {
        "model_cbm",
        "model_onnx",
        "model_json",
        "report_json",
        "feature_importances",
    }
    assert all(outputs[k].dtype == np.uint8 for k in ("model_cbm", "model_onnx", "model_json"))
    report = job.report()
    assert report["task"] == "classification" and report["device"] == "cpu"
    assert report["iterations"] == 40 and report["eval_source"] == "eval_fraction"
    assert (
        report["learning_curves"]["train"]["Logloss"][-1] == report["metrics"]["train"]["Logloss"]
    )
    assert len(report["learning_curves"]["eval"]["AUC"]) == 40
    assert report["metrics"]["eval"]["AUC"] > 0.9
    assert report["params"]["loss_function"] == "Logloss"
    assert not {"train_dir", "snapshot_file", "save_snapshot"} & set(report["params"])
    assert report["feature_importances"] == outputs["feature_importances"].tolist()
    assert len(report["feature_names"]) == X.shape[1]
    assert job.result.metrics is not None and job.result.metrics.extra["eval_rows"] == 142

    model = job.model(CatBoostClassifier)
    session = ort.InferenceSession(outputs["model_onnx"].tobytes())
    label, probabilities = session.run(None, {"features": X[:20].astype(np.float32)})
    np.testing.assert_array_equal(label, model.predict(X[:20]))
    as_rows = [[row[0], row[1]] for row in probabilities]  # a ZipMap: one {class: p} per row
    np.testing.assert_allclose(as_rows, model.predict_proba(X[:20]), atol=1e-6)  # float32
    assert json.loads(outputs["model_json"].tobytes())["oblivious_trees"]


@pytest.mark.parametrize("metric_period", [1, 5])
def test_early_stopping_keeps_the_best_iteration_and_reports_its_eval_metric(
    tmp_path: Path, metric_period: int
) -> None:
    X, y = diabetes()
    config = {
        "task": "regression",
        "iterations": 300,
        "learning_rate": 0.3,
        "random_seed": 0,
        "early_stopping_rounds": 10,
        "metric_period": metric_period,
    }
    inputs = npz_bytes(X=X[:350], y=y[:350], X_eval=X[350:], y_eval=y[350:])

    job = run_job(tmp_path, config, inputs)

    assert job.result.ok, job.log
    report = job.report()
    best = report["best_iteration"]
    assert best is not None and report["iterations"] == best + 1 < 300
    eval_curve = report["learning_curves"]["eval"]["RMSE"]
    assert report["metrics"]["eval"]["RMSE"] == eval_curve[best] == min(eval_curve)
    assert report["eval_source"] == "X_eval"


def test_string_class_labels_with_weights_and_class_weights_train_a_multiclass_model(
    tmp_path: Path,
) -> None:
    X, y = load_iris(return_X_y=True)
    species = np.array(["setosa", "versicolor", "virginica"])[y]
    config = {
        "task": "classification",
        "iterations": 30,
        "class_weights": {"setosa": 1, "versicolor": 2, "virginica": 2},
    }
    weight = np.linspace(0.5, 1.5, len(y))

    job = run_job(tmp_path, config, npz_bytes(X=X, y=species, weight=weight))

    assert job.result.ok, job.log
    assert job.report()["params"]["loss_function"] == "MultiClass"
    assert (job.model(CatBoostClassifier).predict(X).ravel() == species).mean() > 0.95


def test_categorical_strings_one_array_per_feature_with_named_eval_columns(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(0)
    rows = 400
    color = rng.choice(np.array(["red", "green", "blue"]), rows)
    size = rng.integers(0, 5, rows)
    weight = rng.normal(size=rows)
    y = ((color == "red") ^ (size > 2)).astype(np.int64)
    arrays = {"color": color, "size": size, "weight_kg": weight, "y": y}
    arrays |= {f"X_eval/{k}": v[:50] for k, v in arrays.items() if k != "y"} | {"y_eval": y[:50]}
    config = {
        "task": "classification",
        "iterations": 60,
        "cat_features": ["color", "size"],
        "outputs": ["json"],  # model_cbm comes anyway
    }

    job = run_job(tmp_path, config, npz_bytes(**arrays))

    assert job.result.ok, job.log
    report = job.report()
    assert report["feature_names"] == ["color", "size", "weight_kg"]
    assert report["cat_features"] == [0, 1]
    model = job.model(CatBoostClassifier)
    rows_as_given = [[c, int(s), float(w)] for c, s, w in zip(color, size, weight, strict=True)]
    assert (model.predict(rows_as_given) == y).mean() > 0.95
    exported = json.loads(job.outputs()["model_json"].tobytes())
    assert len(exported["features_info"]["categorical_features"]) == 2


def test_string_matrix_with_categorical_columns_parses_the_numeric_ones(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    rows = 300
    city = rng.choice(np.array(["paris", "tokyo", "lima"]), rows)
    amount = rng.normal(size=rows)
    X = np.column_stack([amount.astype(str), city])
    y = amount * 2 + (city == "tokyo")
    config = {"task": "regression", "iterations": 50, "cat_features": [1]}
    config |= {"feature_names": ["amount", "city"]}

    job = run_job(tmp_path, config, npz_bytes(X=X, y=y))

    assert job.result.ok, job.log
    model = job.model(CatBoostRegressor)
    rows_as_given = [[float(a), c] for a, c in zip(amount, city, strict=True)]
    assert np.corrcoef(model.predict(rows_as_given), y)[0, 1] > 0.95


def test_ranking_gathers_scattered_groups_and_splits_off_whole_groups(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    groups = rng.permutation(np.repeat(np.arange(40), 8))  # rows of a group are scattered
    X = rng.normal(size=(len(groups), 4))
    y = (X[:, 0] > 0).astype(np.int64) + (X[:, 1] > 1)
    config = {"task": "ranking", "iterations": 30, "eval_fraction": 0.25, "random_seed": 3}

    job = run_job(tmp_path, config, npz_bytes(X=X, y=y, group_id=groups))

    assert job.result.ok, job.log
    report = job.report()
    assert report["params"]["loss_function"] == "YetiRank"
    assert report["eval_source"] == "eval_fraction"
    assert job.result.metrics is not None
    assert job.result.metrics.extra["eval_rows"] == 10 * 8  # 10 whole groups of 8 rows
    scores = job.model(CatBoostRanker).predict(X)
    assert np.corrcoef(scores, y)[0, 1] > 0.5


def test_progress_streams_about_a_hundred_lines_ending_with_the_last_iteration(
    tmp_path: Path,
) -> None:
    X, y = diabetes()
    config = {"task": "regression", "iterations": 500, "depth": 2, "verbose": 1}

    job = run_job(tmp_path, config, npz_bytes(X=X, y=y))

    assert job.result.ok, job.log
    iterations = [line for line in job.log.splitlines() if line.split(":")[0].isdigit()]
    assert 95 <= len(iterations) <= 102
    assert iterations[0].startswith("0:\tlearn: ") and iterations[-1].startswith("499:")
    assert "verbose is ignored" in job.log


# Resuming from a snapshot (SPEC §4.3)


def snapshot_training() -> tuple[dict[str, Any], bytes, np.ndarray[Any, Any]]:
    rng = np.random.default_rng(5)
    X = rng.random((10_000, 10))
    y = X[:, 0] * 3 + np.sin(X[:, 1] * 6) + rng.random(10_000) * 0.1
    config = {"task": "regression", "iterations": 2000, "random_seed": 9}
    return config, npz_bytes(X=X, y=y), X


@pytest.mark.slow
def test_a_killed_training_resumes_from_its_snapshot_and_makes_the_same_model(
    tmp_path: Path,
) -> None:
    config, inputs, X = snapshot_training()
    options = {"snapshot_interval_sec": 1}
    first = tmp_path / "attempt-1"
    prepare(first, config, inputs, options=options)
    process = subprocess.Popen(
        [sys.executable, "-m", MODULE, "spec.json"],
        cwd=first,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    snapshot = first / "checkpoint" / "snapshot.cbs"
    deadline = time.monotonic() + 30
    while not snapshot.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert process.poll() is None, "the training ended before it could be killed"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert not (first / "out" / "result.json").exists()

    # The next agent restores the snapshot into a fresh job folder.
    second = tmp_path / "attempt-2"
    (second / "restored").mkdir(parents=True)
    shutil.copy(snapshot, second / "restored" / "snapshot.cbs")
    resumed = run_job(
        second, config, inputs, options={**options, "resume_from": "restored/snapshot.cbs"}
    )

    assert resumed.result.ok, resumed.log
    assert resumed.result.metrics is not None
    extra = resumed.result.metrics.extra
    assert extra["resumed"] is True and extra["iterations"] == 2000
    assert 0 < extra["iterations_run_this_attempt"] < 2000
    assert f"resuming from snapshot at iteration {2000 - extra['iterations_run_this_attempt']}" in (
        resumed.log
    )
    params = {k: v for k, v in config.items() if k != "task"}
    local = CatBoostRegressor(**params, thread_count=THREADS, verbose=0, allow_writing_files=False)
    local.fit(X, load_npz_bytes(inputs)["y"])
    np.testing.assert_array_equal(resumed.model(CatBoostRegressor).predict(X), local.predict(X))


def load_npz_bytes(data: bytes) -> dict[str, Any]:
    with np.load(io.BytesIO(data)) as archive:
        return {name: archive[name] for name in archive.files}


def test_the_snapshot_of_a_finished_training_gives_its_model_without_training_again(
    tmp_path: Path,
) -> None:
    X, y = diabetes()
    config = {"task": "regression", "iterations": 100, "random_seed": 1, "eval_fraction": 0.2}
    first = run_job(tmp_path / "attempt-1", config, npz_bytes(X=X, y=y))
    assert first.result.ok, first.log
    (tmp_path / "attempt-2" / "restored").mkdir(parents=True)
    shutil.copy(
        tmp_path / "attempt-1" / "checkpoint" / "snapshot.cbs",
        tmp_path / "attempt-2" / "restored" / "snapshot.cbs",
    )

    again = run_job(
        tmp_path / "attempt-2",
        config,
        npz_bytes(X=X, y=y),
        options={"resume_from": "restored/snapshot.cbs"},
    )

    assert again.result.ok, again.log
    assert again.result.metrics is not None
    assert again.result.metrics.extra["resumed"] is True
    assert again.result.metrics.extra["iterations_run_this_attempt"] == 0
    assert again.report()["metrics"] == first.report()["metrics"]
    np.testing.assert_array_equal(
        again.model(CatBoostRegressor).predict(X), first.model(CatBoostRegressor).predict(X)
    )


def test_a_snapshot_catboost_cannot_use_means_training_from_the_start(tmp_path: Path) -> None:
    X, y = diabetes()
    (tmp_path / "restored").mkdir()
    (tmp_path / "restored" / "snapshot.cbs").write_bytes(b"not a snapshot")

    job = run_job(
        tmp_path,
        {"task": "regression", "iterations": 30},
        npz_bytes(X=X, y=y),
        options={"resume_from": "restored/snapshot.cbs"},
    )

    assert job.result.ok, job.log
    assert job.result.metrics is not None
    assert job.result.metrics.extra["resumed"] is False
    assert job.result.metrics.extra["iterations_run_this_attempt"] == 30


# Devices


@pytest.mark.skipif(get_gpu_device_count() > 0, reason="this node has a GPU CatBoost can use")
def test_cuda_job_on_a_node_without_cuda_fails_instead_of_training_on_cpu(
    tmp_path: Path,
) -> None:
    X, y = diabetes()

    job = run_job(
        tmp_path,
        {"task": "regression", "iterations": 10},
        npz_bytes(X=X, y=y),
        runtime_name="catboost_cuda",
    )

    code, message = job.error
    assert job.returncode == 0 and code == "RUNTIME_ERROR"
    assert message.startswith("CUDA is not available to CatBoost on this node")
    assert not (tmp_path / "out" / "outputs.npz").exists()


@pytest.mark.skipif(get_gpu_device_count() == 0, reason="CatBoost sees no GPU here")
def test_cuda_job_trains_on_the_gpu_and_says_so(tmp_path: Path) -> None:
    X, y = breast_cancer()

    job = run_job(
        tmp_path,
        {"task": "classification", "iterations": 50, "random_seed": 0},
        npz_bytes(X=X, y=y),
        runtime_name="catboost_cuda",
    )

    assert job.result.ok, job.log
    assert job.result.metrics is not None and job.result.metrics.device == "cuda"
    assert job.report()["params"]["task_type"] == "GPU"
    assert (job.model(CatBoostClassifier).predict(X) == y).mean() > 0.9


# Bad configs and inputs: a failed result that says what to fix, exit 0

X_OK, Y_OK = diabetes()
GOOD_INPUTS = npz_bytes(X=X_OK[:60], y=Y_OK[:60])
REGRESSION = {"task": "regression", "iterations": 5}
Y_NAN = Y_OK[:60].copy()
Y_NAN[7] = np.nan


@pytest.mark.parametrize(
    ("config", "fragments"),
    [
        pytest.param(b"task: regression\n", ["not JSON", "model_url"], id="not-json"),
        pytest.param(GOOD_INPUTS, ["zip archive", "swap model_url and inputs_url"], id="npz"),
        pytest.param({"task": "clustering"}, ["task:", "'classification'"], id="unknown-task"),
        pytest.param({"iterations": 5}, ["which task"], id="no-task"),
        pytest.param({**REGRESSION, "iterations": -3}, ["iterations:", "-3"], id="negative"),
        pytest.param({**REGRESSION, "iterations": 10**7}, ["iterations:", "1000000"], id="huge"),
        pytest.param({**REGRESSION, "train_dir": "/tmp/x"}, ["train_dir", "write files"], id="dir"),
        pytest.param(
            {**REGRESSION, "snapshot_file": "../../etc/snap"},
            ["snapshot_file cannot be set", "snapshots"],
            id="snapshot-file",
        ),
        pytest.param({**REGRESSION, "task_type": "GPU"}, ["task_type", "catboost_cuda"], id="dev"),
        pytest.param(
            {**REGRESSION, "thread_count": 64}, ["thread_count 64", "share of 2"], id="thr"
        ),
        pytest.param({**REGRESSION, "iteratons": 5}, ["'iteratons'", "iterations?"], id="typo"),
        pytest.param(
            {**REGRESSION, "n_estimators": 5},
            ["n_estimators", "iterations", "give one"],
            id="alias",
        ),
        pytest.param(
            {**REGRESSION, "cat_features": [0], "outputs": ["onnx"]}, ["ONNX"], id="onnx-with-cats"
        ),
        pytest.param(
            {**REGRESSION, "loss_function": "Hinge2"}, ["CatBoost refused", "Hinge2"], id="loss"
        ),
        pytest.param(
            {"task": "classification", "loss_function": "RMSE", "iterations": 5},
            ["loss_function"],
            id="loss-for-task",
        ),
        pytest.param({**REGRESSION, "eval_fraction": 1.5}, ["eval_fraction"], id="fraction"),
    ],
)
def test_bad_config_fails_with_invalid_config_naming_the_field(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    config: dict[str, Any] | bytes,
    fragments: list[str],
) -> None:
    job = run_in_process(tmp_path, monkeypatch, capsys, config, GOOD_INPUTS)

    code, message = job.error
    assert job.returncode == 0 and code == "INVALID_CONFIG", message
    for fragment in fragments:
        assert fragment in message


@pytest.mark.parametrize("depth", [20, 100_000])
def test_a_deeply_nested_config_is_invalid_config_not_a_crashed_runtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], depth: int
) -> None:
    nested = b'{"task": "regression", "metadata": ' + b"[" * depth + b"]" * depth + b"}"
    job = run_in_process(tmp_path, monkeypatch, capsys, nested, GOOD_INPUTS)

    code, message = job.error
    assert (job.returncode, code) == (0, "INVALID_CONFIG"), message
    assert "nest more than 8 levels deep" in message


def test_thread_count_zero_is_refused_before_catboost_can_crash_on_it(tmp_path: Path) -> None:
    job = run_job(tmp_path, {**REGRESSION, "thread_count": 0}, GOOD_INPUTS)  # SIGFPE in CatBoost

    code, message = job.error
    assert (job.returncode, code) == (0, "INVALID_CONFIG"), job.log
    assert "thread_count: 0 is not a number of threads" in message


@pytest.mark.parametrize(
    ("config", "inputs", "fragments"),
    [
        pytest.param(REGRESSION, npz_bytes(X=X_OK), ["no y"], id="no-y"),
        pytest.param(
            REGRESSION, npz_bytes(X=X_OK[:100], y=Y_OK[:99]), ["y has 99 rows but X has 100"],
            id="length-mismatch",
        ),
        pytest.param(
            REGRESSION, npz_bytes(X=X_OK[:1], y=Y_OK[:1]), ["1-row data set", "at least 2"],
            id="one-row",
        ),
        pytest.param(
            REGRESSION, npz_bytes(X=X_OK[:60], y=Y_NAN), ["y contains NaN at row 7"], id="nan-y"
        ),
        pytest.param(
            {**REGRESSION, "cat_features": [12]}, GOOD_INPUTS,
            ["cat_features index 12 is out of range for X with 10 columns"], id="cat-range",
        ),
        pytest.param(
            REGRESSION, json.dumps(REGRESSION).encode(),
            ["did not point to an NPZ", "swap model_url and inputs_url"], id="json-as-inputs",
        ),
        pytest.param(REGRESSION, None, ["needs inputs_url"], id="no-inputs"),
        pytest.param(
            REGRESSION, npz_bytes(X=X_OK[:, 0], y=Y_OK), ["X must be 2-D", "reshape(-1, 1)"],
            id="1d-X",
        ),
        pytest.param(
            REGRESSION, npz_bytes(X=np.array([["1", "a"], ["2", "b"]]), y=np.array([1.0, 2.0])),
            ["X column 1 holds 'a' at row 0", "cat_features"], id="string-not-listed",
        ),
        pytest.param(
            {"task": "classification", "iterations": 5, "cat_features": [0]},
            npz_bytes(X=np.array([[0.5, 1.0], [1.0, 2.0]]), y=np.array([0, 1])),
            ["X column 0 holds 0.5 at row 0", "integers or strings"], id="float-category",
        ),
        pytest.param(
            REGRESSION, npz_bytes(X=X_OK[:60], y=Y_OK[:60].astype(str)),
            ["task regression needs numbers"], id="string-y",
        ),
        pytest.param(
            {"task": "ranking", "iterations": 5}, GOOD_INPUTS, ["needs group_id"], id="no-groups"
        ),
        pytest.param(
            REGRESSION, npz_bytes(X=X_OK[:60], y=Y_OK[:60], extra=Y_OK[:60]),
            ['unexpected arrays "extra"'], id="extra-array",
        ),
        pytest.param(
            {"task": "classification", "iterations": 5},
            npz_bytes(X=X_OK[:60], y=np.zeros(60)),
            ["CatBoost refused the data", "one unique value"], id="constant-target",
        ),
    ],
)  # fmt: skip
def test_bad_inputs_fail_with_invalid_inputs_saying_what_to_fix(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    config: dict[str, Any],
    inputs: bytes | None,
    fragments: list[str],
) -> None:
    job = run_in_process(tmp_path, monkeypatch, capsys, config, inputs)

    code, message = job.error
    assert job.returncode == 0 and code == "INVALID_INPUTS", message
    for fragment in fragments:
        assert fragment in message


def test_a_config_mistake_is_reported_without_importing_catboost(tmp_path: Path) -> None:
    prepare(tmp_path, {**REGRESSION, "train_dir": "/"}, GOOD_INPUTS)
    code = (
        "import sys\n"
        f"from {MODULE} import main\n"
        "main(['spec.json'])\n"
        "assert 'catboost' not in sys.modules, 'catboost was imported'\n"
    )

    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )

    assert done.returncode == 0, done.stderr
    job = finish(tmp_path, done.returncode, done.stderr)
    assert job.error[0] == "INVALID_CONFIG"


def test_every_catboost_keyword_is_either_passed_through_or_refused_with_a_reason() -> None:
    """…or set by the runtime over the tenant's value (REPLACED), which the log says."""
    import inspect

    known = CATBOOST_PARAMS | set(REFUSED) | REPLACED | IGNORED | set(ALIASES) | set(CONFIG_KEYS)
    for estimator in (CatBoostClassifier, CatBoostRegressor, CatBoostRanker):
        keywords = set(inspect.signature(estimator.__init__).parameters) - {"self"}
        assert keywords <= known, f"{estimator.__name__}: {sorted(keywords - known)}"
    assert not CATBOOST_PARAMS & set(REFUSED)
    assert not CATBOOST_PARAMS & REPLACED and not REPLACED & set(REFUSED)
