"""A missing optional dependency is found before anything is uploaded or run.

`sys.modules[name] = None` makes `import name` fail in this process as it does where
the package is not installed; the server (in-process, real) then shows that no
artifact and no invoke was created.
"""

import json
import sys
from collections.abc import Awaitable, Callable

import numpy as np
import pytest

from gpu_share import AsyncClient, ConfigurationError
from gpu_share.protocol import agent as wire
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.testing.simulated_agent import SimulatedAgent, done_report, npz_bytes

MODEL = b"an onnx model, as far as the coordinator can tell"
X = np.arange(40, dtype=np.float64).reshape(20, 2)
Y = (X[:, 0] > 20).astype(np.int64)
REPORT = {"metrics": {"train": {"Logloss": 0.1}}, "iterations": 7, "best_iteration": 6}


async def train(job: wire.LeasedJob) -> wire.ResultReport:
    """What the catboost runtime returns, with model bytes no CatBoost needs to read."""
    outputs = npz_bytes(
        model_cbm=np.frombuffer(b"CBM model bytes", dtype=np.uint8),
        report_json=np.frombuffer(json.dumps(REPORT).encode(), dtype=np.uint8),
    )
    return done_report(job, outputs)


async def nothing_was_sent(sdk: AsyncClient) -> bool:
    return not (await sdk.artifacts()).items and not (await sdk.invokes()).items


async def test_train_catboost_without_catboost_fails_before_uploading_and_says_how_to_install(
    sdk: AsyncClient,
    serving: Callable[..., Awaitable[SimulatedAgent]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    agent = await serving(train, runtimes=[RuntimeName.CATBOOST_CPU])
    with monkeypatch.context() as patched:
        patched.setitem(sys.modules, "catboost", None)
        with pytest.raises(ConfigurationError) as caught:
            await sdk.train_catboost(X, Y, {"iterations": 7}, gpu=False)
    message = str(caught.value)
    assert "pip install 'gpu-share[catboost]'" in message and "load_model=False" in message
    assert await nothing_was_sent(sdk)
    assert agent.leased == []


async def test_train_catboost_with_load_model_false_needs_no_catboost(
    sdk: AsyncClient,
    serving: Callable[..., Awaitable[SimulatedAgent]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await serving(train, runtimes=[RuntimeName.CATBOOST_CPU])
    monkeypatch.setitem(sys.modules, "catboost", None)
    model, report = await sdk.train_catboost(X, Y, {"iterations": 7}, gpu=False, load_model=False)
    assert model is None
    assert report.model_cbm == b"CBM model bytes"
    assert report.metrics == {"train": {"Logloss": 0.1}} and report.iterations == 7
    assert report.invoke.runtime is RuntimeName.CATBOOST_CPU


async def test_invoke_and_wait_without_numpy_fails_before_uploading(
    sdk: AsyncClient,
    serving: Callable[..., Awaitable[SimulatedAgent]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    agent = await serving()
    with monkeypatch.context() as patched:
        patched.setitem(sys.modules, "numpy", None)
        with pytest.raises(ConfigurationError) as caught:
            await sdk.invoke_and_wait("onnx_cpu", MODEL, b"an NPZ, as far as anyone can tell")
    message = str(caught.value)
    assert "invoke_and_wait" in message and "pip install numpy" in message
    assert "outputs(…).raw" in message  # the way without numpy
    assert await nothing_was_sent(sdk)
    assert agent.leased == []
