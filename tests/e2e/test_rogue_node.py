"""A second registered node that learns a session's id can neither answer its forwards nor
settle it: only the node and channel the session was placed on are heard."""

import asyncio
import contextlib
import json

import numpy as np
import pytest
from websockets.asyncio.client import connect

from gpu_share.examples import DIGITS_EXPECTED_LABELS
from gpu_share.protocol.sessions import ForwardHeader, pack
from gpu_share.testing.live import Live
from gpu_share.testing.simulated_agent import SimulatedAgent
from tests.e2e.test_sessions import ROWS, forward, npz, npz_bytes, open_session

pytestmark = pytest.mark.slow

FORGED_ERROR = {"code": "RUNTIME_ERROR", "message": "forged by another node"}


async def rogue_node(live: Live) -> SimulatedAgent:
    rogue = SimulatedAgent(live.base_url)
    await rogue.register(live.enrollment_token)
    return rogue


async def test_a_rogue_node_cannot_answer_or_settle_another_nodes_session(live: Live) -> None:
    live.agent()
    session = await open_session(live)
    rogue = await rogue_node(live)
    ws_url = "ws" + live.base_url.removeprefix("http") + "/v1/agent/sessions/ws"
    stop = asyncio.Event()

    async def flood() -> None:
        """Answer every request id this session could have, over and over."""
        async with connect(
            ws_url, additional_headers={"Authorization": f"Bearer {rogue.client.key}"}
        ) as ws:
            failed = {"type": "failed", "session_id": session["id"], "error": FORGED_ERROR}
            await ws.send(json.dumps(failed))
            forged = npz_bytes(label=np.array([-1]), probabilities=np.zeros((1, 10)))
            while not stop.is_set():
                for request_id in range(1, 200):
                    header = ForwardHeader(
                        type="result", request_id=request_id, session_id=session["id"], format="npz"
                    )
                    await ws.send(pack(header, forged))
                await asyncio.sleep(0)

    flooding = asyncio.create_task(flood())
    try:
        for i in range(40):
            response = await forward(live, session["id"], npz_bytes(input=ROWS[i % 8 : i % 8 + 1]))
            assert response.status_code == 200, response.text
            assert npz(response.content)["label"].tolist() == [DIGITS_EXPECTED_LABELS[i % 8]]
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await flooding
        await rogue.aclose()
    state = await live.http.get(f"/v1/gpu/sessions/{session['id']}", headers=live.tenant_headers)
    assert state.json()["status"] == "ready"  # the forged "failed" was not heard either
