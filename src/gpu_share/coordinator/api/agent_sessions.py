"""The agent's persistent WebSocket for sessions (see `gpu_share.protocol.sessions`)."""

import asyncio
import contextlib
import json
import logging

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from pydantic import ValidationError

from gpu_share.coordinator.api.deps import get_runtime
from gpu_share.coordinator.errors import ApiError
from gpu_share.coordinator.runtime import Runtime
from gpu_share.coordinator.services import sessions
from gpu_share.coordinator.services.accounts import authenticate
from gpu_share.protocol.accounts import Role
from gpu_share.protocol.sessions import ForwardHeader, SessionFailed, SessionReady, unpack

router = APIRouter()
log = logging.getLogger(__name__)

POLICY_VIOLATION = 1008


@router.websocket("/v1/agent/sessions/ws")
async def agent_channel(websocket: WebSocket) -> None:
    runtime = get_runtime(websocket)
    header = websocket.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    try:
        if scheme.lower() != "bearer" or not key:
            raise ApiError("missing Bearer key")
        async with runtime.db.read() as session:
            principal = await authenticate(session, key.strip())
        if principal.role is not Role.AGENT or principal.node_id is None:
            raise ApiError("this channel needs an agent node key (gpu_ak_…)")
    except ApiError as exc:
        await websocket.close(code=POLICY_VIOLATION, reason=exc.message[:120])
        return
    node_id = principal.node_id
    await websocket.accept()
    hub = runtime.sessions
    hub.attach(node_id, websocket)
    log.info("node %s connected its session channel", node_id)
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            if message.get("bytes") is not None:
                _on_frame(runtime, message["bytes"])
            elif message.get("text") is not None:
                await _on_text(runtime, node_id, message["text"])
    except WebSocketDisconnect:
        pass
    finally:
        lost = hub.detach(node_id, websocket)
        if lost:
            log.warning(
                "node %s dropped its session channel; %d session(s) failed", node_id, len(lost)
            )
            # The server may cancel this handler as the connection dies; the record of
            # the failure must be written all the same.
            recording = asyncio.ensure_future(sessions.on_node_lost(runtime, lost))
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(recording)


def _on_frame(runtime: Runtime, frame: bytes) -> None:
    try:
        header, payload = unpack(frame)
        result = ForwardHeader.model_validate(header)
    except (ValueError, ValidationError):
        log.warning("dropped a malformed frame from an agent")
        return
    runtime.sessions.answer(result, payload)


async def _on_text(runtime: Runtime, node_id: str, text: str) -> None:
    try:
        message = json.loads(text)
        kind = message.get("type")
        if kind == "ready":
            ready = SessionReady.model_validate(message)
            await sessions.on_ready(runtime, node_id, ready.session_id, ready.device, ready.inputs)
        elif kind == "failed":
            failed = SessionFailed.model_validate(message)
            await sessions.on_failed(runtime, node_id, failed.session_id, failed.error)
    except (ValueError, ValidationError, AttributeError):
        log.warning("dropped a malformed message from node %s", node_id)
