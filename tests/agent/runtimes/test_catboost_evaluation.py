"""The trusted node's half of a CatBoost spot check (docs/trust.md): the runtime trains the
job and scores the model another node returned for it; what it measures, held to that
node's report (`trust/training_comparison`), passes an honest training and catches a
report that flatters, a model cut short, other parameters and a file that is no model."""

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpu_share.agent.runtimes.npz import load_npz
from gpu_share.coordinator.services.trust.comparison import DEFAULT_TOLERANCES, Outcome
from gpu_share.coordinator.services.trust.training_comparison import compare_training
from tests.agent.runtimes.test_catboost import Job, diabetes, npz_bytes, run_in_process

CONFIG = {"task": "regression", "loss_function": "RMSE", "iterations": 40, "depth": 4}
EVALUATED = "evaluated.npz"


def data() -> bytes:
    X, y = diabetes()
    return npz_bytes(X=X, y=y)


def train(
    directory: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    config: dict[str, Any],
    evaluated: bytes | None = None,
) -> Job:
    directory.mkdir()
    options = {}
    if evaluated is not None:
        (directory / EVALUATED).write_bytes(evaluated)
        options["evaluate"] = EVALUATED
    job = run_in_process(directory, monkeypatch, capsys, config, data(), options=options)
    assert job.result.ok, job.log
    return job


def outputs_bytes(job: Job) -> bytes:
    assert job.result.outputs is not None
    return (job.directory / job.result.outputs).read_bytes()


def judged(node: Job | dict[str, Any], check: Job) -> Outcome:
    arrays = node.outputs() if isinstance(node, Job) else node
    return compare_training(arrays, check.outputs(), DEFAULT_TOLERANCES).outcome


@pytest.mark.parametrize("split", [{}, {"eval_fraction": 0.25, "random_seed": 3}])
def test_an_honest_training_scores_as_it_reported(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    split: dict[str, Any],
) -> None:
    config = {**CONFIG, **split}
    node = train(tmp_path / "node", monkeypatch, capsys, config)
    check = train(tmp_path / "check", monkeypatch, capsys, config, outputs_bytes(node))
    evaluation = json.loads(check.outputs()["evaluation_json"].tobytes())
    assert evaluation["model"] == "loaded" and evaluation["trees"] == node.report()["iterations"]
    if split:
        assert evaluation["metrics"]["eval"]["RMSE"] == pytest.approx(
            node.report()["metrics"]["eval"]["RMSE"], rel=1e-6
        )
        assert evaluation["expected_trees"] is None  # use_best_model may shrink it
    else:
        assert evaluation["expected_trees"] == 40
    assert check.outputs()["evaluated_predictions"].dtype == np.float64
    assert judged(node, check) is Outcome.MATCH
    assert "model_cbm" in check.outputs()  # the check trained too: the tenant's result


def test_a_flattering_report_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = {**CONFIG, "eval_fraction": 0.25}
    node = train(tmp_path / "node", monkeypatch, capsys, config)
    arrays = node.outputs()
    report = node.report()
    report["metrics"]["eval"]["RMSE"] *= 0.8
    arrays["report_json"] = np.frombuffer(json.dumps(report).encode(), np.uint8)
    check = train(tmp_path / "check", monkeypatch, capsys, config, npz_bytes(**arrays))
    assert judged(arrays, check) is Outcome.MISMATCH


@pytest.mark.parametrize(
    "shortcut", [{"iterations": 8}, {"depth": 2}], ids=["fewer-trees", "shallower"]
)
def test_a_cheaper_model_than_the_config_asks_for_is_caught(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    shortcut: dict[str, Any],
) -> None:
    node = train(tmp_path / "node", monkeypatch, capsys, {**CONFIG, **shortcut})
    check = train(tmp_path / "check", monkeypatch, capsys, CONFIG, outputs_bytes(node))
    assert judged(node, check) is Outcome.MISMATCH


def test_a_file_that_is_no_model_is_caught_and_one_never_fetched_tells_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    node = train(tmp_path / "node", monkeypatch, capsys, CONFIG)
    arrays = node.outputs()
    arrays["model_cbm"] = np.frombuffer(b"not a model at all", np.uint8)
    junk = train(tmp_path / "junk", monkeypatch, capsys, CONFIG, npz_bytes(**arrays))
    assert judged(arrays, junk) is Outcome.MISMATCH
    directory = tmp_path / "missing"
    directory.mkdir()
    missing = run_in_process(
        directory, monkeypatch, capsys, CONFIG, data(), options={"evaluate": EVALUATED}
    )
    assert missing.result.ok, missing.log  # the training is the tenant's all the same
    assert judged(node, missing) is Outcome.INCONCLUSIVE
    assert load_npz(directory / "out" / "outputs.npz")["evaluation_json"].size
