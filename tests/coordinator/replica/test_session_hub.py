"""The session hub (`replica/session_hub.py`): how the forwards in flight are answered
when a session ends under them."""

import asyncio
import json
from datetime import UTC, datetime

import pytest

from gpu_share.coordinator.replica.session_hub import ForwardFailed, LiveSession, SessionHub
from gpu_share.protocol.agent import ArtifactRef
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.protocol.sessions import OpenSession, SessionError, SessionStatus
from gpu_share.testing.clock import SystemClock


class Channel:
    """An agent's channel as the hub sees it: what it was sent, in order."""

    def __init__(self) -> None:
        self.texts: list[dict[str, object]] = []
        self.frames = 0

    async def send_text(self, data: str) -> None:
        self.texts.append(json.loads(data))

    async def send_bytes(self, data: bytes) -> None:
        self.frames += 1


async def hub_with_a_forward_in_flight() -> tuple[SessionHub, Channel, asyncio.Task[object]]:
    hub = SessionHub(SystemClock())
    channel = Channel()
    hub.attach("nod_1", channel)
    live = LiveSession("ses_1", "ten_1", "nod_1", 60, datetime.now(UTC))
    model = ArtifactRef(url="https://example.com/m.onnx", platform=False, sha256=None, size=None)
    await hub.open(
        live,
        OpenSession(
            session_id="ses_1",
            runtime=RuntimeName.ONNX_CPU,
            model=model,
            max_batch=None,
            max_concurrency=1,
        ),
    )
    hub.settle("ses_1", SessionStatus.READY)
    in_flight = asyncio.create_task(hub.forward(live, "npz", b"rows", timeout=30))
    while channel.frames == 0:
        await asyncio.sleep(0)
    return hub, channel, in_flight


async def test_a_tenants_close_answers_the_forwards_in_flight_as_closed() -> None:
    hub, channel, in_flight = await hub_with_a_forward_in_flight()
    await hub.close("ses_1", "deleted by its tenant", status=SessionStatus.CLOSED)
    with pytest.raises(ForwardFailed) as closed:
        await in_flight
    assert (closed.value.status, closed.value.error.code) == (409, "SESSION_CLOSED")
    assert channel.texts[-1] == {
        "type": "close",
        "session_id": "ses_1",
        "reason": "deleted by its tenant",
    }


async def test_a_stopping_process_answers_them_as_for_a_lost_node() -> None:
    hub, channel, in_flight = await hub_with_a_forward_in_flight()
    stopped = SessionError(code=ErrorCode.NODE_LOST, message="the coordinator process stopped")
    await hub.close_all("the coordinator is shutting down", stopped)
    with pytest.raises(ForwardFailed) as failed:
        await in_flight
    assert (failed.value.status, failed.value.error) == (410, stopped)
    assert hub.held() == []
    assert channel.texts[-1]["type"] == "close"  # the agent stops it too
