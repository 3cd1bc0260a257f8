"""What a coordinator process does with the requests its peers relay to the sessions it
holds (`replica.peers`). They arrive on its relay listener (`http.relay_listener`), never
on the public port, over links whose other end proved it holds the key every process
shares; so nothing but a peer can drive a session through here.

    open     {tenant_id, node_id, idle_timeout_sec, message: OpenSession}  → nothing
    forward  {tenant_id, format} + the payload                            → the answer
    close    {reason, status}                                             → nothing

A refusal is the `ApiError` raised here, which the peer raises again as it is.
"""

import logging
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from gpu_share.coordinator.core.errors import ApiError, NotFound, field_error
from gpu_share.coordinator.replica.peers import PeerAnswer, RelayCall, RelayedOpen, RelayHandler
from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.sessions.sessions import NotConnectedYet, Sessions
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.sessions import OpenSession, SessionStatus

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)
NOTHING = PeerAnswer(format="", body=b"")


class _Open(BaseModel):
    tenant_id: str
    node_id: str
    idle_timeout_sec: int
    message: OpenSession


class _Forward(BaseModel):
    tenant_id: str
    format: str = "npz"


class _Close(BaseModel):
    reason: str
    status: SessionStatus


def relay_handler(replica: Replica) -> RelayHandler:
    sessions = Sessions(replica.db, replica.hub, replica.clock, replica.settings)  # no peers

    async def handle(call: RelayCall) -> PeerAnswer:
        log.debug("relayed %s for session %s", call.action, call.session_id)
        if call.action == "forward":
            forward = _parsed(_Forward, call.fields)
            answer = await sessions.forward_here(
                forward.tenant_id, call.session_id, forward.format, call.body
            )
            return PeerAnswer(format=answer.format, body=answer.body)
        if call.action == "open":
            opening = _parsed(_Open, call.fields)
            if opening.message.session_id != call.session_id:
                raise field_error("message.session_id", "must be the session relayed")
            try:
                await sessions.open_here(
                    RelayedOpen(
                        opening.tenant_id,
                        opening.node_id,
                        opening.idle_timeout_sec,
                        opening.message,
                    )
                )
            except NotConnectedYet:
                raise ApiError(
                    f"node {opening.node_id}'s channel is no longer held here",
                    code=ErrorCode.NO_CAPACITY,
                ) from None
            return NOTHING
        if call.action == "close":
            closing = _parsed(_Close, call.fields)
            await replica.hub.close(call.session_id, closing.reason, status=closing.status)
            return NOTHING
        raise NotFound(f"no relay action {call.action!r}")

    return handle


def _parsed(model: type[M], fields: Mapping[str, Any]) -> M:
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        raise ApiError(
            f"a malformed relay request: {exc}", code=ErrorCode.VALIDATION_ERROR
        ) from exc
