"""A real coordinator over HTTP, real agent processes, real onnxruntime in the bwrap sandbox."""

import asyncio
import base64
import io
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest
from fastapi import FastAPI

from gpu_share.coordinator.app import create_app
from gpu_share.coordinator.core.settings import Settings
from gpu_share.examples import DIGITS_EXPECTED_LABELS, DIGITS_INPUTS, DIGITS_MODEL
from gpu_share.testing.clock import SystemClock
from gpu_share.testing.factories import ADMIN
from gpu_share.testing.live import Live, fast_settings
from gpu_share.testing.models import slow_model, unloadable_model
from gpu_share.testing.servers import free_port, serve
from gpu_share.testing.waiting import eventually

pytestmark = pytest.mark.slow


def npz(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


async def test_digits_invoke_runs_in_the_sandbox_and_matches_onnxruntime(live: Live) -> None:
    live.agent()
    model_url = await live.upload(DIGITS_MODEL.read_bytes(), "model")
    inputs_url = await live.upload(DIGITS_INPUTS.read_bytes(), "inputs")
    invoke_id = await live.invoke(model_url=model_url, inputs_url=inputs_url)
    state = await live.finished(invoke_id)
    assert state["status"] == "done", state
    outputs = npz(base64.b64decode(state["result"]["outputs_inline_base64"]))
    assert outputs["label"].tolist() == DIGITS_EXPECTED_LABELS
    session = ort.InferenceSession(str(DIGITS_MODEL), providers=["CPUExecutionProvider"])
    inputs = npz(DIGITS_INPUTS.read_bytes())
    _, probabilities = session.run(None, inputs)
    np.testing.assert_allclose(outputs["probabilities"], probabilities, rtol=1e-6)
    metrics = state["result"]["metrics"]
    assert metrics["device"] == "cpu"
    assert metrics["execution_provider"] == "CPUExecutionProvider"
    assert metrics["duration_ms"] > 0 and metrics["queue_ms"] is not None
    logs = await live.logs(invoke_id)
    assert "bwrap sandbox" in logs
    assert "model: 4424 bytes" in logs
    # A machine this loaded can starve the agent past a 3 s test lease: the job is then
    # requeued and its second attempt finds the model in the cache, as it should.
    assert "downloaded" in logs or ("from cache" in logs and state["attempts"] > 1), logs

    again = await live.invoke(model_url=model_url, inputs_url=inputs_url)
    assert (await live.finished(again))["status"] == "done"
    assert "model: 4424 bytes" in (second_logs := await live.logs(again))
    assert "from cache" in second_logs


async def test_empty_inputs_url_runs_a_zero_filled_batch(live: Live) -> None:
    live.agent()
    model_url = await live.upload(DIGITS_MODEL.read_bytes(), "model")
    state = await live.finished(await live.invoke(model_url=model_url, inputs_url=""))
    assert state["status"] == "done", state
    outputs = npz(base64.b64decode(state["result"]["outputs_inline_base64"]))
    assert outputs["label"].shape == (1,)


async def test_bad_model_fails_precisely_and_the_agent_keeps_serving(live: Live) -> None:
    live.agent()
    bad = await live.upload(unloadable_model(), "model")  # parses; onnxruntime refuses it
    state = await live.finished(await live.invoke(model_url=bad))
    assert state["status"] == "failed"
    assert state["error"]["code"] == "INVALID_MODEL"
    assert "valid ONNX model" in state["error"]["message"]
    good = await live.upload(DIGITS_MODEL.read_bytes(), "model")
    assert (await live.finished(await live.invoke(model_url=good)))["status"] == "done"


async def test_hostile_model_url_is_refused_by_the_agent(live: Live) -> None:
    live.agent()
    state = await live.finished(await live.invoke(model_url=f"{live.base_url}/v1/admin/tenants"))
    assert state["status"] == "failed"
    assert state["error"]["code"] == "URL_FORBIDDEN"
    assert "loopback" in state["error"]["message"]


async def test_timeout_kills_the_job(live: Live) -> None:
    live.agent()
    model_url = await live.upload(slow_model(100_000_000), "model")
    state = await live.finished(await live.invoke(model_url=model_url, timeout_sec=2))
    assert state["status"] == "timeout"
    assert state["error"]["code"] == "TIMEOUT"


async def test_cancel_stops_a_running_job(live: Live) -> None:
    live.agent()
    model_url = await live.upload(slow_model(100_000_000), "model")
    invoke_id = await live.invoke(model_url=model_url)
    await live.wait_for(invoke_id, lambda s: s["status"] == "running")
    await asyncio.sleep(1.0)  # the runtime process is busy now
    canceled = await live.http.post(
        f"/v1/gpu/invokes/{invoke_id}/cancel", headers=live.tenant_headers
    )
    assert canceled.status_code == 200
    state = await live.finished(invoke_id, timeout=30)
    assert state["status"] == "canceled"


async def test_kill_9_of_the_agent_requeues_the_job_to_another_agent(live: Live) -> None:
    first = live.agent("first")
    model_url = await live.upload(slow_model(4_000_000), "model")
    invoke_id = await live.invoke(model_url=model_url)
    running = await live.wait_for(invoke_id, lambda s: s["status"] == "running")
    first.kill()
    live.agent("second")
    state = await live.finished(invoke_id, timeout=90)
    assert state["status"] == "done", state
    assert state["attempts"] == 2
    assert state["node_id"] != running["node_id"]
    assert "stopped responding; requeued" in await live.logs(invoke_id)


async def test_a_paused_agents_late_result_is_refused(live: Live) -> None:
    first = live.agent("first")
    model_url = await live.upload(slow_model(2_000_000), "model")
    invoke_id = await live.invoke(model_url=model_url)
    running = await live.wait_for(invoke_id, lambda s: s["status"] == "running")
    first.pause()
    requeued = await live.wait_for(
        invoke_id, lambda s: s["attempts"] == 1 and s["status"] == "queued", 30
    )
    assert requeued["node_id"] is None
    second = live.agent("second")
    done = await live.finished(invoke_id, timeout=90)
    assert (done["status"], done["attempts"]) == ("done", 2)
    first.resume()
    refusals = ("refused the result (lease stale)", "lease lost; result not reported")

    async def log_of_first() -> str:
        return first.log

    await eventually(  # the first agent wakes, finishes its copy, and is told it lost
        log_of_first,
        lambda log: any(refusal in log for refusal in refusals),
        what="the first agent told that its result is refused",
        detail=live.agent_logs,
    )
    final = await live.get(invoke_id)
    assert (final["status"], final["node_id"], final["finished_at"]) == (
        "done",
        done["node_id"],
        done["finished_at"],
    )
    assert done["node_id"] != running["node_id"]
    del second


async def test_coordinator_restart_mid_job_loses_nothing(
    settings: Settings, tmp_path: Path
) -> None:
    fast_settings(settings)
    port = free_port()
    first_app: FastAPI = create_app(settings, clock=SystemClock())
    base_url = f"http://127.0.0.1:{port}"
    async with (
        serve(first_app, port=port),
        httpx.AsyncClient(base_url=base_url, headers=ADMIN, timeout=30) as http,
    ):
        live = Live(base_url, http, tmp_path)
        await live.setup()
        agent = live.agent()
        model_url = await live.upload(slow_model(3_000_000), "model")
        invoke_id = await live.invoke(model_url=model_url)
        await live.wait_for(invoke_id, lambda s: s["status"] == "running")
    # The coordinator is gone for a moment while the job runs on.
    await asyncio.sleep(1.0)
    second_app = create_app(settings, clock=SystemClock())
    try:
        async with (
            serve(second_app, port=port),
            httpx.AsyncClient(base_url=base_url, headers=ADMIN, timeout=30) as http,
        ):
            live.http = http
            state = await live.finished(invoke_id, timeout=90)
            assert state["status"] == "done", state
            assert state["attempts"] == 1
    finally:
        await asyncio.to_thread(agent.stop)


async def test_a_busy_agent_leases_its_next_job_with_the_result(live: Live) -> None:
    agent = live.agent()  # one slot
    model_url = await live.upload(DIGITS_MODEL.read_bytes(), "model")
    inputs_url = await live.upload(DIGITS_INPUTS.read_bytes(), "inputs")
    warm_up = await live.invoke(model_url=model_url, inputs_url=inputs_url)
    assert (await live.finished(warm_up))["status"] == "done"
    assert "leased with the result of" not in agent.log  # nothing was queued behind it

    agent.pause()  # so that all three are queued before its first job ends
    invokes = [await live.invoke(model_url=model_url, inputs_url=inputs_url) for _ in range(3)]
    agent.resume()

    for invoke_id in invokes:
        state = await live.finished(invoke_id)
        assert state["status"] == "done", state
        outputs = npz(base64.b64decode(state["result"]["outputs_inline_base64"]))
        assert outputs["label"].tolist() == DIGITS_EXPECTED_LABELS
    # Queued behind the first, the others came with a result rather than a lease request.
    assert "leased with the result of" in agent.log
