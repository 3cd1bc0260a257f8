"""The agent's persistent WebSocket for sessions (see `gpu_share.protocol.sessions`)."""

import asyncio
import contextlib
import json
import logging

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from pydantic import ValidationError

from gpu_share.coordinator.api.auth import NodeChannel
from gpu_share.coordinator.api.deps import SessionsDep
from gpu_share.coordinator.http.replica import ReplicaDep
from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.sessions import channels
from gpu_share.coordinator.services.sessions.sessions import Sessions
from gpu_share.protocol.sessions import ForwardHeader, SessionFailed, SessionReady, unpack

router = APIRouter()
log = logging.getLogger(__name__)


@router.websocket("/v1/agent/sessions/ws")
async def agent_channel(
    websocket: WebSocket, caller: NodeChannel, replica: ReplicaDep, sessions: SessionsDep
) -> None:
    node_id = caller.node_id
    await websocket.accept()
    hub = replica.hub
    hub.attach(node_id, websocket)
    async with replica.db.write() as session:  # peers find the channel here (`channels`)
        await channels.attach(session, node_id, replica.id, replica.clock.now())
    log.info("node %s connected its session channel", node_id)
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            if message.get("bytes") is not None:
                _on_frame(replica, websocket, node_id, message["bytes"])
            elif message.get("text") is not None:
                await _on_text(sessions, node_id, message["text"])
    except WebSocketDisconnect:
        pass
    finally:
        lost = hub.detach(node_id, websocket)
        if not hub.connected(node_id):  # else a newer connection of the node holds it here
            forgetting = asyncio.ensure_future(_forget_channel(replica, node_id))
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(forgetting)
        if lost:
            log.warning(
                "node %s dropped its session channel; %d session(s) failed", node_id, len(lost)
            )
            # The server may cancel this handler as the connection dies; the record of
            # the failure must be written all the same.
            recording = asyncio.ensure_future(sessions.on_node_lost(lost))
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(recording)


async def _forget_channel(replica: Replica, node_id: str) -> None:
    try:
        async with replica.db.write() as session:
            await channels.detach(session, node_id, replica.id)
    except Exception:  # the row then names this process until it leaves or dies
        log.exception("could not record that node %s's channel left", node_id)


def _on_frame(replica: Replica, websocket: WebSocket, node_id: str, frame: bytes) -> None:
    try:
        header, payload = unpack(frame)
        result = ForwardHeader.model_validate(header)
    except (ValueError, ValidationError):
        log.warning("dropped a malformed frame from node %s", node_id)
        return
    if not replica.hub.answer(websocket, result, payload):
        log.warning(
            "dropped an answer from node %s for session %s, which it does not hold",
            node_id,
            result.session_id,
        )


async def _on_text(sessions: Sessions, node_id: str, text: str) -> None:
    try:
        message = json.loads(text)
        kind = message.get("type")
        if kind == "ready":
            ready = SessionReady.model_validate(message)
            await sessions.on_ready(node_id, ready.session_id, ready.device, ready.inputs)
        elif kind == "failed":
            failed = SessionFailed.model_validate(message)
            await sessions.on_failed(node_id, failed.session_id, failed.error)
    except (ValueError, ValidationError, AttributeError):
        log.warning("dropped a malformed message from node %s", node_id)
