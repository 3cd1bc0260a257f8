"""CatBoost trains on every GPU the job was given (SPEC §4.3, multi-GPU): `task_type="GPU"`
and `devices` "0:1:…" in the sandbox's numbering, whatever `devices` the tenant wrote.

There is no GPU here: the parameters CatBoost would get are caught just before training."""

from pathlib import Path
from typing import Any

import catboost.utils
import pytest

from gpu_share.agent.runtimes import catboost as runtime
from gpu_share.agent.runtimes.catboost_config import parse_train_config
from gpu_share.agent.runtimes.runner import FailureCode, JobFailure
from tests.agent.runtimes.test_catboost import diabetes, npz_bytes, run_in_process

FOUR_GPUS = "GPU-aaaa,GPU-bbbb,GPU-cccc,GPU-dddd"


def test_devices_cover_exactly_the_visible_gpus_in_the_sandboxs_numbering() -> None:
    assert runtime.gpu_params(4, FOUR_GPUS) == {"task_type": "GPU", "devices": "0:1:2:3"}
    assert runtime.gpu_params(8, "GPU-aaaa,GPU-bbbb") == {"task_type": "GPU", "devices": "0:1"}
    assert runtime.gpu_params(1, "GPU-aaaa") == {"task_type": "GPU", "devices": "0"}


def test_fewer_gpus_seen_than_given_trains_on_those_it_sees_and_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert runtime.gpu_params(2, FOUR_GPUS)["devices"] == "0:1"
    assert "CatBoost sees 2 of the 4 GPUs given to the job" in capsys.readouterr().err


@pytest.mark.parametrize(("seen", "visible"), [(0, FOUR_GPUS), (4, ""), (0, None)])
def test_no_gpu_seen_or_given_is_a_runtime_error_not_a_cpu_training(
    seen: int, visible: str | None
) -> None:
    with pytest.raises(JobFailure) as failed:
        runtime.gpu_params(seen, visible)
    assert failed.value.code is FailureCode.RUNTIME_ERROR


def test_a_tenants_devices_are_set_aside_not_refused() -> None:
    config = parse_train_config(b'{"task": "regression", "iterations": 5, "devices": "0:1:5"}')
    assert config.replaced == {"devices": "0:1:5"}
    assert "devices" not in config.catboost_params(2)


@pytest.mark.parametrize(
    ("runtime_name", "expected", "said"),
    [
        pytest.param(
            "catboost_cuda",
            {"task_type": "GPU", "devices": "0:1:2:3"},
            'devices "7" is replaced by "0:1:2:3"',
            id="cuda",
        ),
        pytest.param(
            "catboost_cpu",
            {"task_type": "CPU"},
            "devices is ignored: a catboost_cpu job trains on the CPU",
            id="cpu",
        ),
    ],
)
def test_the_parameters_catboost_gets_name_the_jobs_gpus_and_the_log_says_what_was_replaced(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    runtime_name: str,
    expected: dict[str, Any],
    said: str,
) -> None:
    monkeypatch.setattr(catboost.utils, "get_gpu_device_count", lambda: 4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", FOUR_GPUS)
    given: dict[str, Any] = {}

    def no_check(*args: Any) -> None:
        pass

    def catch(catboost: Any, config: Any, params: dict[str, Any], *args: Any) -> Any:
        given.update(params)
        raise JobFailure(FailureCode.RUNTIME_ERROR, "caught before training")

    monkeypatch.setattr(runtime, "_check_params", no_check)
    monkeypatch.setattr(runtime, "_fit", catch)
    X, y = diabetes()

    job = run_in_process(
        tmp_path,
        monkeypatch,
        capsys,
        {"task": "regression", "iterations": 5, "devices": "7"},
        npz_bytes(X=X[:50], y=y[:50]),
        runtime_name=runtime_name,
    )

    assert job.error == ("RUNTIME_ERROR", "caught before training")
    assert {key: given.get(key) for key in ("task_type", "devices")} == {
        "task_type": expected["task_type"],
        "devices": expected.get("devices"),
    }
    assert said in job.log
