"""Fair share with a real agent (SPEC §4.1): a tenant's lone invoke starts within one
slot's turn, however many invokes another tenant has queued."""

from typing import Any

import pytest

from gpu_share.examples import DIGITS_MODEL
from gpu_share.testing.factories import create_tenant
from gpu_share.testing.live import Live
from gpu_share.testing.waiting import WAIT_SEC, eventually

pytestmark = pytest.mark.slow


async def test_a_lone_invoke_starts_within_one_slot_turn(live: Live) -> None:
    live.agent()  # one slot
    model_url = await live.upload(DIGITS_MODEL.read_bytes(), "model")
    first = await live.invoke(model_url=model_url)  # also waits for the agent to register
    flood = [first] + [await live.invoke(model_url=model_url) for _ in range(11)]
    other = await create_tenant(live.http, "Lone Tenant")
    lone_model = (
        await live.http.post(
            "/v1/artifacts",
            params={"kind": "model"},
            content=DIGITS_MODEL.read_bytes(),
            headers=other.headers,
        )
    ).json()["url"]
    submitted = await live.http.post(
        "/v1/gpu/invoke",
        json={"runtime": "onnx_cpu", "model_url": lone_model, "inputs_url": ""},
        headers=other.headers,
    )
    lone_id = submitted.json()["id"]

    async def lone_state() -> dict[str, Any]:
        state: dict[str, Any] = (
            await live.http.get(f"/v1/gpu/invokes/{lone_id}", headers=other.headers)
        ).json()
        return state

    lone = await eventually(  # behind the flood's turns: twelve jobs at most
        lone_state,
        lambda state: state["status"] in ("done", "failed", "timeout", "canceled"),
        what="the lone invoke finished",
        timeout=2 * WAIT_SEC,
        detail=live.agent_logs,
    )
    assert lone["status"] == "done", lone
    states = [await live.get(invoke_id) for invoke_id in flood]
    # Queued after all twelve, it went at most one slot's turn after being queued: of the
    # flood, at most the one leased at that very moment (by a claim that read the queue
    # before the lone invoke's submit committed) was assigned between the two. Counted
    # from when it was queued: on a loaded machine the agent works through several of the
    # flood while the lone tenant is made and uploads its model, as it should.
    cut_in = [
        s
        for s in states
        if s["assigned_at"] and lone["created_at"] < s["assigned_at"] < lone["assigned_at"]
    ]
    assert len(cut_in) <= 1, (lone["created_at"], [s["assigned_at"] for s in states])
