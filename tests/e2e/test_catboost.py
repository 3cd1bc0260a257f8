"""CatBoost training (SPEC §1.6, §4.3) through a real coordinator and real agent processes."""

import base64
import hashlib
import io
import json
from typing import Any

import catboost
import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer

from gpu_share.testing.live import Live
from gpu_share.testing.waiting import eventually

pytestmark = pytest.mark.slow

PARAMS = {"loss_function": "Logloss", "iterations": 60, "depth": 4, "random_seed": 7}


def npz_bytes(**arrays: Any) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def unpack(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


async def train(live: Live, config: dict[str, Any] | bytes, inputs: bytes, **body: Any) -> str:
    config_bytes = config if isinstance(config, bytes) else json.dumps(config).encode()
    config_url = await live.upload(config_bytes, "config")
    inputs_url = await live.upload(inputs, "inputs")
    return await live.invoke(
        runtime="catboost_cpu",
        model_url=config_url,
        inputs_url=inputs_url,
        model_checksum_sha256=hashlib.sha256(config_bytes).hexdigest(),
        inputs_checksum_sha256=hashlib.sha256(inputs).hexdigest(),
        timeout_sec=300,
        **body,
    )


async def outputs_of(live: Live, state: dict[str, Any]) -> dict[str, np.ndarray]:
    result = state["result"]
    if result["outputs_inline_base64"]:
        return unpack(base64.b64decode(result["outputs_inline_base64"]))
    response = await live.http.get(result["outputs_url"], headers=live.tenant_headers)
    assert response.status_code == 200
    return unpack(response.content)


async def test_seed_style_training_matches_local_training(live: Live) -> None:
    live.agent()
    data = load_breast_cancer()
    X, y = data.data.astype(np.float64), data.target.astype(np.int64)
    invoke_id = await train(
        live, {**PARAMS, "task": "classification", "thread_count": 1}, npz_bytes(X=X, y=y)
    )
    state = await live.finished(invoke_id, timeout=120)
    assert state["status"] == "done", state
    assert state["result"]["metrics"]["device"] == "cpu"
    outputs = await outputs_of(live, state)
    model = catboost.CatBoostClassifier()
    model.load_model(blob=outputs["model_cbm"].tobytes())
    local = catboost.CatBoostClassifier(
        **PARAMS, thread_count=1, verbose=False, allow_writing_files=False
    )
    local.fit(X, y)
    np.testing.assert_array_equal(model.predict_proba(X), local.predict_proba(X))
    report = json.loads(outputs["report_json"].tobytes())
    assert report["iterations"] == 60 and "Logloss" in report["metrics"]["train"]
    logs = await live.logs(invoke_id)
    assert "learn:" in logs or "iteration" in logs


async def test_outputs_over_the_inline_limit_are_stored_on_the_platform(
    live: Live, settings: Any
) -> None:
    settings.inline_output_limit_bytes = 1000
    live.agent()
    rng = np.random.default_rng(0)
    X, y = rng.random((300, 5)), rng.random(300)
    invoke_id = await train(live, {"task": "regression", "iterations": 30}, npz_bytes(X=X, y=y))
    state = await live.finished(invoke_id, timeout=120)
    assert state["status"] == "done", state
    assert state["result"]["outputs_inline_base64"] is None
    assert "/v1/artifacts/" in state["result"]["outputs_url"]
    response = await live.http.get(state["result"]["outputs_url"], headers=live.tenant_headers)
    assert hashlib.sha256(response.content).hexdigest() == state["result"]["outputs_sha256"]
    assert unpack(response.content)["model_cbm"].size > 0


class PresignedStore:
    """A stand-in for the tenant's object storage: accepts PUTs, can fail the first ones."""

    def __init__(self, fail_first: int = 0, status: int = 503) -> None:
        self.fail_first = fail_first
        self.status = status
        self.attempts = 0
        self.stored: bytes | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.attempts += 1
        status = self.status if self.attempts <= self.fail_first else 200
        if status == 200:
            self.stored = body
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})


@pytest.mark.parametrize(
    ("fail_first", "status", "outcome"), [(1, 503, "done"), (99, 403, "failed")]
)
async def test_outputs_upload_is_retried_and_its_failure_keeps_the_result(
    live: Live, fail_first: int, status: int, outcome: str
) -> None:
    from gpu_share.testing.servers import serve

    store = PresignedStore(fail_first, status)
    live.agent(allow_networks=("127.0.0.0/8",))
    rng = np.random.default_rng(0)
    X, y = rng.random((200, 4)), rng.random(200)
    async with serve(store) as storage:  # type: ignore[arg-type]
        invoke_id = await train(
            live,
            {"task": "regression", "iterations": 20},
            npz_bytes(X=X, y=y),
            outputs_upload={"url": f"{storage}/bucket/out.npz?X-Signature=abc", "method": "PUT"},
        )
        state = await live.finished(invoke_id, timeout=120)
    assert state["status"] == outcome, state
    if outcome == "done":
        assert store.attempts == 2
        assert store.stored is not None
        assert hashlib.sha256(store.stored).hexdigest() == state["result"]["outputs_sha256"]
        assert state["result"]["outputs_url"].startswith(storage)
    else:
        assert state["error"]["code"] == "OUTPUT_UPLOAD_FAILED"
        kept = await live.http.get(state["result"]["outputs_url"], headers=live.tenant_headers)
        assert hashlib.sha256(kept.content).hexdigest() == state["result"]["outputs_sha256"]


@pytest.mark.parametrize(
    ("config", "inputs", "code", "fragment"),
    [
        (
            {"task": "regression", "loss_function": "NoSuchLoss"},
            npz_bytes(X=np.zeros((4, 2)), y=np.zeros(4)),
            "INVALID_CONFIG",
            "CatBoost refused the train config: Key 'NoSuchLoss' not found",
        ),
        ({"task": "regression"}, npz_bytes(X=np.zeros((4, 2))), "INVALID_INPUTS", "y"),
    ],
    ids=["catboost-refuses", "no-y"],
)
async def test_bad_training_requests_fail_precisely_and_the_agent_keeps_serving(
    live: Live, config: Any, inputs: bytes, code: str, fragment: str
) -> None:
    live.agent()
    state = await live.finished(await train(live, config, inputs), timeout=60)
    assert state["status"] == "failed"
    assert state["error"]["code"] == code, state["error"]
    assert fragment in state["error"]["message"]


GOOD_INPUTS = npz_bytes(X=np.zeros((4, 2)), y=np.zeros(4))


@pytest.mark.parametrize(
    ("config", "inputs", "refused", "fragment"),
    [
        (b"{not json", GOOD_INPUTS, "config", "it is not JSON"),
        ({"task": "clustering"}, GOOD_INPUTS, "config", "task"),
        ({"task": "regression", "train_dir": "/etc"}, GOOD_INPUTS, "config", "train_dir"),
        (
            {"task": "regression"},
            json.dumps({"task": "regression"}).encode(),
            "inputs",
            "it is JSON, such as a CatBoost train config (upload those with kind=config)",
        ),
    ],
    ids=["not-json", "unknown-task", "train-dir", "swapped"],
)
async def test_training_files_the_runtime_would_refuse_are_refused_at_upload(
    live: Live, config: Any, inputs: bytes, refused: str, fragment: str
) -> None:
    """What the runtime's own config contract refuses is refused where it is made, with
    the runtime's words; only what CatBoost itself or the data decide reaches a node."""
    config_bytes = config if isinstance(config, bytes) else json.dumps(config).encode()
    for kind, data in (("config", config_bytes), ("inputs", inputs)):
        response = await live.http.post(
            "/v1/artifacts", params={"kind": kind}, content=data, headers=live.tenant_headers
        )
        if kind == refused:
            assert response.status_code == 422, response.text
            assert fragment in response.json()["error"]["message"]
        else:
            assert response.status_code == 201, response.text


async def test_a_killed_agent_s_training_resumes_from_its_snapshot_elsewhere(live: Live) -> None:
    fast = {"GPUSHARE_AGENT_CHECKPOINT_INTERVAL_SEC": "1"}
    first = live.agent("first", env=fast)
    rng = np.random.default_rng(3)
    X, y = rng.random((4000, 20)), rng.integers(0, 2, 4000)
    iterations = 3000
    invoke_id = await train(
        live,
        {
            "task": "classification",
            "iterations": iterations,
            "depth": 6,
            "random_seed": 1,
            "thread_count": 1,
        },
        npz_bytes(X=X, y=y),
    )
    await eventually(
        lambda: live.http.get(
            "/v1/artifacts", params={"kind": "checkpoint"}, headers=live.tenant_headers
        ),
        lambda listed: listed.json()["items"],
        what="a snapshot uploaded to the platform",
        detail=live.agent_logs,
    )
    state = await live.get(invoke_id)
    assert state["status"] == "running"
    first.kill()
    live.agent("second", env=fast)
    state = await live.finished(invoke_id, timeout=240)
    assert state["status"] == "done", state
    assert state["attempts"] == 2
    extra = state["result"]["metrics"]["extra"]
    assert extra["resumed"] is True
    assert 0 < extra["iterations_run_this_attempt"] < iterations
    outputs = await outputs_of(live, state)
    model = catboost.CatBoostClassifier()
    model.load_model(blob=outputs["model_cbm"].tobytes())
    assert model.tree_count_ == iterations
    assert set(np.unique(model.predict(X))) <= {0, 1}
    assert "resuming from a" in await live.logs(invoke_id)
