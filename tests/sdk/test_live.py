"""The SDK against a real server process and a real agent process (bwrap sandbox,
real onnxruntime and CatBoost): the seed's Quick and Production paths end to end."""

import io
from collections.abc import Iterator

import numpy as np
import pytest

from gpu_share import (
    AsyncClient,
    Client,
    InvokeFailed,
    InvokeTimedOut,
    NoCapacity,
    ValidationError,
)
from gpu_share.examples import DIGITS_EXPECTED_LABELS, DIGITS_INPUTS, DIGITS_MODEL
from gpu_share.protocol.invokes import InvokeStatus
from gpu_share.testing.factories import HELLO_WORLD
from gpu_share.testing.models import slow_model, unloadable_model
from gpu_share.testing.stack import LiveStack

pytestmark = pytest.mark.slow

POLL = 0.1


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    with LiveStack(tmp_path_factory.mktemp("sdk-stack")) as live:
        yield live


@pytest.fixture
def client(stack: LiveStack) -> Iterator[Client]:
    with Client(stack.base_url, stack.tenant_key(), poll_interval=POLL) as c:
        yield c


def test_the_seeds_hello_world_answers_no_capacity_on_a_machine_without_a_gpu(
    client: Client,
) -> None:
    with pytest.raises(NoCapacity, match=r"can run onnx_cuda on 1 GPU: .* Try onnx_cpu, which"):
        client.invoke(str(HELLO_WORLD["runtime"]), str(HELLO_WORLD["model_url"]), "")


def test_production_path_from_files_runs_in_the_sandbox(client: Client) -> None:
    out = client.invoke_and_wait("onnx_cpu", DIGITS_MODEL, DIGITS_INPUTS)
    assert out["label"].tolist() == DIGITS_EXPECTED_LABELS
    assert out["probabilities"].shape == (8, 10)
    assert out.metrics.device == "cpu" and out.metrics.execution_provider == "CPUExecutionProvider"
    assert "bwrap sandbox" in client.logs(out.invoke.id)
    assert len(client.artifacts().items) == 2


async def test_async_client_with_a_numpy_batch_over_a_socket(stack: LiveStack) -> None:
    with np.load(DIGITS_INPUTS) as archive:
        batch = archive["input"]
    async with AsyncClient(stack.base_url, stack.tenant_key(), poll_interval=POLL) as client:
        model = await client.upload_artifact(DIGITS_MODEL, "model")
        out = await client.invoke_and_wait("onnx_cpu", model.url, batch)  # one unnamed array
        assert out["label"].tolist() == DIGITS_EXPECTED_LABELS
        zero = await client.invoke_and_wait("onnx_cpu", model.url)  # the smoke test
        assert zero["label"].shape == (1,)


def test_a_file_that_is_no_model_is_refused_at_upload_with_the_reason(client: Client) -> None:
    with pytest.raises(ValidationError) as caught:
        client.invoke_and_wait("onnx_cpu", b"<html>not a model</html>")
    assert caught.value.status == 422
    assert "the file is not an ONNX model: it is text" in caught.value.message


def test_a_bad_model_fails_with_the_runtimes_code_and_the_log_tail(client: Client) -> None:
    with pytest.raises(InvokeFailed) as caught:
        client.invoke_and_wait("onnx_cpu", unloadable_model())  # parses; onnxruntime refuses
    error = caught.value
    assert (error.code, error.status) == ("INVALID_MODEL", InvokeStatus.FAILED)
    assert "valid ONNX model" in error.message
    assert "onnx_cpu" in error.logs_tail or "model" in error.logs_tail


def test_a_job_past_its_timeout_is_killed_and_raises_invoke_timed_out(client: Client) -> None:
    with pytest.raises(InvokeTimedOut) as caught:
        client.invoke_and_wait("onnx_cpu", slow_model(100_000_000), timeout_sec=1)
    assert caught.value.code == "TIMEOUT"


def test_train_catboost_returns_a_loaded_model_and_its_metrics(client: Client) -> None:
    rng = np.random.default_rng(3)
    features = rng.normal(size=(400, 4))
    labels = (features[:, 0] + 0.5 * features[:, 1] > 0).astype(np.int64)
    model, report = client.train_catboost(
        features[:300],
        labels[:300],
        {"iterations": 60, "depth": 4, "learning_rate": 0.2, "random_seed": 1},
        eval_set=(features[300:], labels[300:]),
        gpu=False,
    )
    assert type(model).__name__ == "CatBoostClassifier"
    assert (model.predict(features[300:]) == labels[300:]).mean() > 0.9
    assert set(report.metrics) == {"train", "eval"} and "Logloss" in report.metrics["eval"]
    assert report.iterations == 60 and len(report.feature_importances) == 4
    assert report.invoke.runtime.value == "catboost_cpu"
    assert report.invoke.result is not None and report.invoke.result.metrics.device == "cpu"


def test_train_catboost_regression_from_a_dataframe_exports_onnx(client: Client) -> None:
    pd = pytest.importorskip("pandas")
    rng = np.random.default_rng(4)
    frame = pd.DataFrame({"area": rng.uniform(20, 200, 200), "rooms": rng.integers(1, 6, 200)})
    price = frame["area"] * 3.0 + frame["rooms"] * 10.0
    model, report = client.train_catboost(
        frame, price, {"iterations": 40, "depth": 3}, gpu=False, outputs=["cbm", "onnx"]
    )
    assert type(model).__name__ == "CatBoostRegressor"
    assert model.feature_names_ == ["area", "rooms"]
    assert report.model_onnx is not None and report.model_onnx[:2] != b""
    onnx = pytest.importorskip("onnx")
    assert onnx.load_model(io.BytesIO(report.model_onnx)).graph.node


def test_train_catboost_on_a_gpu_needs_a_gpu_node(client: Client) -> None:
    with pytest.raises(NoCapacity, match="catboost_cuda"):
        client.train_catboost(np.zeros((4, 2)), [0, 1, 0, 1], {"iterations": 5})
