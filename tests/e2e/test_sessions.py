"""Sessions (SPEC §1.7) end to end: real coordinator, real agent process, real onnxruntime."""

import asyncio
import io
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from gpu_share.examples import DIGITS_EXPECTED_LABELS, DIGITS_INPUTS, DIGITS_MODEL
from gpu_share.testing.factories import create_tenant
from gpu_share.testing.live import AGENT_START_TIMEOUT_SEC, Live
from gpu_share.testing.models import unloadable_model
from gpu_share.testing.waiting import eventually

pytestmark = pytest.mark.slow


def npz_bytes(**arrays: Any) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def npz(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


ROWS = np.load(DIGITS_INPUTS)["input"]


async def state_of(live: Live, session_id: str) -> dict[str, Any]:
    response = await live.http.get(f"/v1/gpu/sessions/{session_id}", headers=live.tenant_headers)
    state: dict[str, Any] = response.json()
    return state


async def open_session(live: Live, **body: Any) -> dict[str, Any]:
    model_url = await live.upload(DIGITS_MODEL.read_bytes(), "model")
    session = await live.create_session({"runtime": "onnx_cpu", "model_url": model_url, **body})
    assert session["status"] == "ready", session
    return session


async def channel_up(live: Live) -> None:
    """Wait until an agent's session channel is connected (a session can be opened)."""
    session = await open_session(live)
    await live.http.delete(f"/v1/gpu/sessions/{session['id']}", headers=live.tenant_headers)


async def forward(
    live: Live, session_id: str, body: bytes | dict[str, Any], headers: dict[str, str] | None = None
) -> httpx.Response:
    if isinstance(body, dict):
        return await live.http.post(
            f"/v1/gpu/sessions/{session_id}/forward",
            json=body,
            headers=headers or live.tenant_headers,
        )
    return await live.http.post(
        f"/v1/gpu/sessions/{session_id}/forward",
        content=body,
        headers={**(headers or live.tenant_headers), "Content-Type": "application/octet-stream"},
    )


async def test_open_forward_many_times_and_close(live: Live) -> None:
    live.agent()
    session = await open_session(live)
    assert session["device"] == "cpu"
    assert session["inputs"][0]["name"] == "input"
    reference = ort.InferenceSession(str(DIGITS_MODEL), providers=["CPUExecutionProvider"])
    for i in range(20):
        rows = ROWS[i % 8 : i % 8 + 1]
        response = await forward(live, session["id"], npz_bytes(input=rows))
        assert response.status_code == 200, response.text
        assert response.headers["content-type"] == "application/octet-stream"
        outputs = npz(response.content)
        labels, probabilities = reference.run(None, {"input": rows})
        assert outputs["label"].tolist() == labels.tolist()
        np.testing.assert_allclose(outputs["probabilities"], probabilities, rtol=1e-6)

    as_json = await forward(live, session["id"], {"inputs": {"input": ROWS.tolist()}})
    assert as_json.status_code == 200
    assert as_json.json()["outputs"]["label"] == DIGITS_EXPECTED_LABELS

    await eventually(  # counters are flushed by the upkeep loop
        lambda: state_of(live, session["id"]),
        lambda state: state["forward_count"] == 21,
        what="the 21 forwards counted",
    )
    closed = await live.http.delete(
        f"/v1/gpu/sessions/{session['id']}", headers=live.tenant_headers
    )
    assert closed.json()["status"] == "closed"
    after = await forward(live, session["id"], npz_bytes(input=ROWS[:1]))
    assert after.status_code == 410
    error = after.json()["error"]
    assert error["code"] == "SESSION_CLOSED"
    assert error["message"] == f"session {session['id']} is closed; create a new session"


async def test_concurrent_forwards_from_several_clients(live: Live) -> None:
    live.agent()
    session = await open_session(live, max_concurrency=4)
    responses = await asyncio.gather(
        *(forward(live, session["id"], npz_bytes(input=ROWS[i % 8 : i % 8 + 1])) for i in range(32))
    )
    for i, response in enumerate(responses):
        assert response.status_code == 200
        assert npz(response.content)["label"].tolist() == [DIGITS_EXPECTED_LABELS[i % 8]]


async def test_bad_inputs_are_422_and_the_session_stays_usable(live: Live) -> None:
    live.agent()
    session = await open_session(live, max_batch=4)
    cases: list[bytes | dict[str, Any]] = [
        b"not an npz",
        npz_bytes(wrong_name=ROWS),
        npz_bytes(input=ROWS.astype(np.float64)),
        {"inputs": {"input": "nope"}},
        {"not_inputs": 1},
        npz_bytes(input=ROWS),  # 8 rows, over max_batch=4
    ]
    for body in cases:
        response = await forward(live, session["id"], body)
        assert response.status_code == 422, (body, response.text)
        assert response.json()["error"]["message"]
    good = await forward(live, session["id"], npz_bytes(input=ROWS[:2]))
    assert good.status_code == 200
    assert npz(good.content)["label"].tolist() == DIGITS_EXPECTED_LABELS[:2]


async def test_other_tenants_cannot_see_or_use_a_session(live: Live) -> None:
    live.agent()
    session = await open_session(live)
    other = await create_tenant(live.http, "Someone Else")
    assert (
        await live.http.get(f"/v1/gpu/sessions/{session['id']}", headers=other.headers)
    ).status_code == 404
    assert (
        await forward(live, session["id"], npz_bytes(input=ROWS[:1]), other.headers)
    ).status_code == 404
    assert (
        await live.http.delete(f"/v1/gpu/sessions/{session['id']}", headers=other.headers)
    ).status_code == 404
    assert (await live.http.get("/v1/gpu/sessions", headers=other.headers)).json() == []


async def test_idle_session_closes_after_its_timeout(live: Live) -> None:
    live.agent()
    session = await open_session(live, idle_timeout_sec=1)
    state = await eventually(
        lambda: state_of(live, session["id"]),
        lambda state: state["status"] != "ready",
        what="the idle session closed",
    )
    assert state["status"] == "closed"
    assert state["error"]["code"] == "IDLE_TIMEOUT"


async def test_killed_agent_fails_the_session_and_forwards_get_a_clear_error(live: Live) -> None:
    agent = live.agent()
    session = await open_session(live)
    agent.kill()
    response = await eventually(
        lambda: forward(live, session["id"], npz_bytes(input=ROWS[:1])),
        lambda response: response.status_code != 200,
        what="the coordinator noticing the killed agent",
    )
    assert response.status_code == 410
    assert response.json()["error"]["code"] == "SESSION_CLOSED"
    assert response.json()["error"]["details"]["reason"] == "NODE_LOST"
    assert "lost its connection" in response.json()["error"]["message"]
    state = (
        await live.http.get(f"/v1/gpu/sessions/{session['id']}", headers=live.tenant_headers)
    ).json()
    assert state["status"] == "failed"


async def test_a_model_that_does_not_load_fails_the_session(live: Live) -> None:
    live.agent()
    bad = await live.upload(unloadable_model(), "model")  # parses; onnxruntime refuses it
    session = await live.create_session({"runtime": "onnx_cpu", "model_url": bad})
    assert session["status"] == "failed"
    assert session["error"]["code"] == "INVALID_MODEL"


async def test_the_sdk_session_forwards_numpy_arrays_sync_and_async(live: Live) -> None:
    from gpu_share import AsyncClient, Client

    live.agent()
    await channel_up(live)
    key = live.tenant_headers["Authorization"].removeprefix("Bearer ")
    async with AsyncClient(live.base_url, key) as client:
        async with client.session(DIGITS_MODEL, runtime="onnx_cpu", idle_timeout_sec=60) as session:
            outputs = await session.forward({"input": ROWS})
            assert outputs["label"].tolist() == DIGITS_EXPECTED_LABELS
            single = await session.forward(ROWS[:1])  # one array for a one-input model
            assert single["label"].tolist() == DIGITS_EXPECTED_LABELS[:1]
        assert session.info is not None and session.info.status == "closed"

    def blocking() -> None:
        with (
            Client(live.base_url, key) as client,
            client.session(DIGITS_MODEL, runtime="onnx_cpu") as s,
        ):
            assert s.forward({"input": ROWS[2:4]})["label"].tolist() == DIGITS_EXPECTED_LABELS[2:4]

    await asyncio.to_thread(blocking)


async def test_the_sdk_recreates_a_session_whose_node_died_when_asked(live: Live) -> None:
    from gpu_share import AsyncClient, SessionClosed

    first = live.agent("first")
    await channel_up(live)
    key = live.tenant_headers["Authorization"].removeprefix("Bearer ")
    async with AsyncClient(live.base_url, key) as client:
        plain = client.session(DIGITS_MODEL, runtime="onnx_cpu")
        await plain.open()
        resilient = client.session(DIGITS_MODEL, runtime="onnx_cpu", recreate=True)
        await resilient.open()
        old_id = resilient.id
        first_node = resilient.info.node_id if resilient.info else None
        live.agent("second")

        async def probe() -> dict[str, Any]:
            session = await open_session(live)
            await live.http.delete(f"/v1/gpu/sessions/{session['id']}", headers=live.tenant_headers)
            return session

        await eventually(
            probe,
            lambda session: session["node_id"] != first_node,
            what="the second agent's channel taking sessions too",
            timeout=AGENT_START_TIMEOUT_SEC,
            detail=live.agent_logs,
        )
        first.kill()
        await eventually(
            lambda: state_of(live, old_id),
            lambda state: state["status"] == "failed",
            what="the coordinator noticing the killed agent",
        )
        with pytest.raises(SessionClosed):
            await plain.forward({"input": ROWS[:1]})
        outputs = await resilient.forward({"input": ROWS[:1]})
        assert outputs["label"].tolist() == DIGITS_EXPECTED_LABELS[:1]
        assert resilient.id != old_id
        await resilient.close()


async def test_a_forward_sent_while_starting_waits_for_ready(
    live: Live, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpu_share.coordinator.services.sessions import sessions as session_service

    live.agent()
    await channel_up(live)
    monkeypatch.setattr(session_service, "CREATE_WAIT_SEC", 0.0)  # answer `starting` at once
    model_url = await live.upload(DIGITS_MODEL.read_bytes(), "model")
    created = await live.http.post(
        "/v1/gpu/sessions",
        json={"runtime": "onnx_cpu", "model_url": model_url},
        headers=live.tenant_headers,
    )
    assert created.json()["status"] == "starting"
    response = await forward(live, created.json()["id"], npz_bytes(input=ROWS[:1]))
    assert response.status_code == 200
    assert npz(response.content)["label"].tolist() == DIGITS_EXPECTED_LABELS[:1]


async def test_deleting_a_session_answers_forwards_in_flight(live: Live) -> None:
    from gpu_share.testing.models import slow_model

    live.agent()
    await channel_up(live)
    model_url = await live.upload(slow_model(200_000_000), "model")
    created = await live.http.post(
        "/v1/gpu/sessions",
        json={"runtime": "onnx_cpu", "model_url": model_url},
        headers=live.tenant_headers,
    )
    session_id = created.json()["id"]
    await eventually(
        lambda: state_of(live, session_id),
        lambda state: state["status"] == "ready",
        what="the slow model's session ready",
        every=0.05,
    )
    in_flight = asyncio.create_task(forward(live, session_id, npz_bytes(x=np.zeros(1, np.float32))))
    assert live.replica is not None
    hub = live.replica.hub

    async def forwards_in_flight() -> int:
        held = hub.get(session_id)
        return len(held.inflight) if held is not None else 0

    await eventually(forwards_in_flight, what="the forward sent on to the agent", every=0.05)
    assert not in_flight.done()  # the model is busy with it
    deleted = await live.http.delete(f"/v1/gpu/sessions/{session_id}", headers=live.tenant_headers)
    assert deleted.json()["status"] == "closed"
    response = await asyncio.wait_for(in_flight, timeout=10)  # answered, not left hanging
    assert response.status_code == 409
    assert "deleted" in response.json()["error"]["message"]
