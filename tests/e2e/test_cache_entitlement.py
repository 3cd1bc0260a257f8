"""Across tenants on one real agent: knowing the SHA-256 of another tenant's file never
gets its bytes out of the agent's cache."""

import hashlib
from typing import Any

import pytest

from gpu_share.examples import DIGITS_INPUTS, DIGITS_MODEL
from gpu_share.testing.factories import TenantHandle, create_tenant
from gpu_share.testing.live import Live

pytestmark = pytest.mark.slow

INPUTS_SHA = hashlib.sha256(DIGITS_INPUTS.read_bytes()).hexdigest()
MODEL_SHA = hashlib.sha256(DIGITS_MODEL.read_bytes()).hexdigest()


async def invoke_as(live: Live, tenant: TenantHandle, **body: Any) -> dict[str, Any]:
    payload = {"runtime": "onnx_cpu", "inputs_url": "", "timeout_sec": 120, **body}
    response = await live.http.post("/v1/gpu/invoke", json=payload, headers=tenant.headers)
    assert response.status_code == 202, response.text
    path = f"/v1/gpu/invokes/{response.json()['id']}?wait=5"
    for _ in range(60):
        state: dict[str, Any] = (await live.http.get(path, headers=tenant.headers)).json()
        if state["status"] in ("done", "failed", "timeout", "canceled"):
            return state
    raise AssertionError(f"invoke stuck at {state}\n{live.agents[0].log[-3000:]}")


async def tenant_a_has_run_its_digits(live: Live) -> None:
    """Tenant A's model and inputs, uploaded by A, are in the agent's cache now."""
    model_url = await live.upload(DIGITS_MODEL.read_bytes(), "model")
    inputs_url = await live.upload(DIGITS_INPUTS.read_bytes(), "inputs")
    invoke_id = await live.invoke(model_url=model_url, inputs_url=inputs_url)
    assert (await live.finished(invoke_id))["status"] == "done"


async def test_tenant_b_naming_tenant_as_checksums_gets_download_failed(live: Live) -> None:
    live.agent()
    await tenant_a_has_run_its_digits(live)
    b = await create_tenant(live.http, "Tenant B")
    own_model = await live.http.post(
        "/v1/artifacts",
        params={"kind": "model", "content_sha256": MODEL_SHA},
        content=DIGITS_MODEL.read_bytes(),
        headers=b.headers,
    )
    assert own_model.status_code == 201, own_model.text

    inputs = await invoke_as(
        live,
        b,
        model_url=own_model.json()["url"],
        inputs_url="http://inputs.invalid/digits.npz",  # RFC 6761: never resolves
        inputs_checksum_sha256=INPUTS_SHA,
    )
    assert inputs["status"] == "failed", inputs
    assert inputs["error"]["code"] == "DOWNLOAD_FAILED"
    assert inputs["error"]["message"].startswith("inputs_url: cannot resolve host")
    assert inputs["result"]["outputs_inline_base64"] is None

    model = await invoke_as(
        live,
        b,
        model_url="http://models.invalid/digits.onnx",
        model_checksum_sha256=MODEL_SHA,
    )
    assert model["status"] == "failed", model
    assert model["error"]["code"] == "DOWNLOAD_FAILED"
    assert model["error"]["message"].startswith("model_url: cannot resolve host")


async def test_tenant_b_cannot_open_a_session_on_tenant_as_model_by_its_checksum(
    live: Live,
) -> None:
    live.agent()
    await tenant_a_has_run_its_digits(live)
    b = await create_tenant(live.http, "Tenant B")
    payload = {
        "runtime": "onnx_cpu",
        "model_url": "http://models.invalid/digits.onnx",
        "model_checksum_sha256": MODEL_SHA,
    }
    session = await live.create_session(payload, b.headers)
    assert session["status"] == "failed", (session, live.agents[0].log[-3000:])
    assert session["error"]["code"] == "DOWNLOAD_FAILED"
