"""One tenant's oversized answer fails that forward alone: two tenants' sessions on one
real agent, a real coordinator served as `gpu-share server` serves it."""

import hashlib
import io
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from onnx import TensorProto, helper

from gpu_share.coordinator.core.settings import Settings
from gpu_share.examples import DIGITS_EXPECTED_LABELS, DIGITS_INPUTS, DIGITS_MODEL
from gpu_share.testing.factories import TenantHandle, bearer, create_tenant
from gpu_share.testing.live import Live
from gpu_share.testing.stack import LiveStack

pytestmark = pytest.mark.slow

MiB = 1024 * 1024
LIMIT = 24 * MiB  # over uvicorn's 16 MiB default frame, so the server's own limit counts
ROWS = np.load(DIGITS_INPUTS)["input"]


@pytest.fixture
def settings(settings: Settings) -> Settings:
    settings.max_forward_bytes = LIMIT
    return settings


def repeat_model() -> bytes:
    """y = x repeated n times: a few bytes in, as many out as the caller asks."""
    graph = helper.make_graph(
        [helper.make_node("Expand", ["x", "n"], ["y"])],
        "repeat",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
            helper.make_tensor_value_info("n", TensorProto.INT64, [1]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["count"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def npz_bytes(**arrays: Any) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def repeat(count: int) -> bytes:
    return npz_bytes(x=np.array([1.5], dtype=np.float32), n=np.array([count], dtype=np.int64))


async def open_session(live: Live, tenant: TenantHandle, model: bytes) -> str:
    uploaded = await live.http.post(
        "/v1/artifacts",
        params={"kind": "model", "content_sha256": hashlib.sha256(model).hexdigest()},
        content=model,
        headers=tenant.headers,
    )
    assert uploaded.status_code == 201, uploaded.text
    payload = {"runtime": "onnx_cpu", "model_url": uploaded.json()["url"]}
    session = await live.create_session(payload, tenant.headers)
    assert session["status"] == "ready", (session, live.agents[0].log[-3000:])
    session_id: str = session["id"]
    return session_id


async def forward(live: Live, tenant: TenantHandle, session_id: str, body: bytes) -> Any:
    return await live.http.post(
        f"/v1/gpu/sessions/{session_id}/forward",
        content=body,
        headers={**tenant.headers, "Content-Type": "application/octet-stream"},
        timeout=120,
    )


def outputs(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


async def test_an_answer_over_the_limit_is_413_and_every_session_on_the_node_keeps_working(
    live: Live,
) -> None:
    live.agent()
    a = await create_tenant(live.http, "Tenant A")
    b = await create_tenant(live.http, "Tenant B")
    a_session = await open_session(live, a, repeat_model())
    b_session = await open_session(live, b, DIGITS_MODEL.read_bytes())

    big = await forward(live, a, a_session, repeat(5_000_000))  # 20 MB: under the limit
    assert big.status_code == 200, big.text
    assert outputs(big.content)["y"].shape == (5_000_000,)

    too_big = await forward(live, a, a_session, repeat(7_000_000))  # 28 MB: over it
    assert too_big.status_code == 413, too_big.text
    error = too_big.json()["error"]
    assert error["code"] == "PAYLOAD_TOO_LARGE"
    assert f"over this session's limit of {LIMIT} bytes" in error["message"]
    assert error["details"] == {"session": "still usable"}

    other = await forward(live, b, b_session, npz_bytes(input=ROWS))
    assert other.status_code == 200, other.text
    assert outputs(other.content)["label"].tolist() == DIGITS_EXPECTED_LABELS
    small = await forward(live, a, a_session, repeat(3))
    assert small.status_code == 200, small.text
    assert outputs(small.content)["y"].tolist() == [1.5, 1.5, 1.5]
    for tenant, session_id in ((a, a_session), (b, b_session)):
        state = await live.http.get(f"/v1/gpu/sessions/{session_id}", headers=tenant.headers)
        assert state.json()["status"] == "ready"


def test_gpu_share_server_carries_answers_up_to_its_forward_limit(tmp_path: Path) -> None:
    """`gpu-share server` itself: an answer over uvicorn's 16 MiB default frame but under
    `max_forward_bytes` arrives whole."""
    with LiveStack(tmp_path) as stack:
        tenant = bearer(stack.tenant_key())
        model = repeat_model()
        with httpx.Client(base_url=stack.base_url, headers=tenant, timeout=120) as http:
            uploaded = http.post(
                "/v1/artifacts",
                params={"kind": "model", "content_sha256": hashlib.sha256(model).hexdigest()},
                content=model,
            )
            assert uploaded.status_code == 201, uploaded.text
            opened = http.post(
                "/v1/gpu/sessions",
                json={"runtime": "onnx_cpu", "model_url": uploaded.json()["url"]},
            )
            assert opened.status_code == 201, opened.text
            session = opened.json()
            for _ in range(1200):  # loading a model is slow on a busy machine
                if session["status"] != "starting":
                    break
                time.sleep(0.05)
                session = http.get(f"/v1/gpu/sessions/{session['id']}").json()
            assert session["status"] == "ready", (session, stack.logs)
            answer = http.post(
                f"/v1/gpu/sessions/{session['id']}/forward",
                content=repeat(5_000_000),  # 20 MB out
                headers={"Content-Type": "application/octet-stream"},
            )
            assert answer.status_code == 200, (answer.text, stack.logs)
            assert outputs(answer.content)["y"].shape == (5_000_000,)
