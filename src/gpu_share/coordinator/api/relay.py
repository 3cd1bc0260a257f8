"""The relay address of a coordinator process: what its peers send to the sessions it
holds (`replica.peers`). Served on a listener of its own (`GPUSHARE_RELAY_HOST`), never on
the public port; each request carries a token sealed for its path with the key every
process shares, so nothing but a peer can drive a session through it.

    POST /relay/sessions/{id}/open      JSON RelayedOpen      → 204
    POST /relay/sessions/{id}/forward?tenant_id=…&format=…   → 200 the answer's bytes
    POST /relay/sessions/{id}/close     {"reason", "status"}  → 204

A refusal answers the `ApiError` the holder raised, as JSON (`code`, `message`,
`details`, `headers`), which the caller raises again as it is.
"""

import hmac
import logging
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpu_share.coordinator.core.errors import ApiError, NotFound, Unauthorized, field_error
from gpu_share.coordinator.replica.peers import (
    ANSWER_FORMAT_HEADER,
    PURPOSE,
    TOKEN_HEADER,
    RelayedOpen,
)
from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.sessions.sessions import NotConnectedYet, Sessions
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.sessions import OpenSession, SessionStatus

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)


class _Open(BaseModel):
    tenant_id: str
    node_id: str
    idle_timeout_sec: int
    message: OpenSession


class _Close(BaseModel):
    reason: str
    status: SessionStatus


def relay_app(replica: Replica) -> Starlette:
    sessions = Sessions(replica.db, replica.hub, replica.clock, replica.settings)  # no peers

    async def handle(request: Request) -> Response:
        try:
            _check_token(replica, request)
            session_id = request.path_params["session_id"]
            action = request.path_params["action"]
            log.debug("relayed %s for session %s", action, session_id)
            body = await request.body()
            if action == "forward":
                tenant_id = request.query_params.get("tenant_id", "")
                fmt = request.query_params.get("format", "npz")
                answer = await sessions.forward_here(tenant_id, session_id, fmt, body)
                return Response(answer.body, headers={ANSWER_FORMAT_HEADER: answer.format})
            if action == "open":
                opening = _parsed(_Open, body)
                if opening.message.session_id != session_id:
                    raise field_error("message.session_id", "must be the session of the path")
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
                return Response(status_code=204)
            if action == "close":
                closing = _parsed(_Close, body)
                await replica.hub.close(session_id, closing.reason, status=closing.status)
                return Response(status_code=204)
            raise NotFound(f"no relay action {action!r}")
        except ApiError as exc:
            return refusal(exc)

    return Starlette(
        routes=[Route("/relay/sessions/{session_id}/{action}", handle, methods=["POST"])]
    )


def _check_token(replica: Replica, request: Request) -> None:
    sealed = replica.signer.unseal(PURPOSE, request.headers.get(TOKEN_HEADER, ""))
    if sealed is None or not hmac.compare_digest(sealed, request.url.path):
        raise Unauthorized("not a peer's relay request")


def _parsed(model: type[M], body: bytes) -> M:
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise ApiError(
            f"a malformed relay request: {exc}", code=ErrorCode.VALIDATION_ERROR
        ) from exc


def refusal(exc: ApiError) -> JSONResponse:
    payload: dict[str, Any] = {
        "code": exc.code.value,
        "message": exc.message,
        "details": exc.details,
        "headers": exc.headers,
    }
    return JSONResponse(payload, status_code=exc.status)
