"""Tenant sessions (SPEC §1.7): a model kept loaded, forwards relayed without polling."""

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from gpu_share.coordinator.api.auth import TenantPrincipal
from gpu_share.coordinator.api.deps import SessionsDep, lease_context
from gpu_share.coordinator.api.paths import SessionId
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.core.errors import PayloadTooLarge
from gpu_share.coordinator.http.replica import ReplicaDep, origins
from gpu_share.protocol.sessions import Session, SessionCreate

router = APIRouter(prefix="/v1/gpu/sessions", tags=["sessions"])


@router.post(
    "", status_code=201, response_model=Session, responses=errors(*AUTH, 404, 410, 422, 503)
)
async def create_session(
    body: SessionCreate,
    request: Request,
    tenant: TenantPrincipal,
    replica: ReplicaDep,
    sessions: SessionsDep,
) -> Session:
    """Load a model on a node and keep it there; `status` is `starting` until it is `ready`."""
    return await sessions.create(
        tenant.tenant_id,
        body,
        origins=origins(replica, request),
        ctx=lease_context(replica, request),
    )


@router.get("", response_model=list[Session], responses=errors(*AUTH, 422))
async def list_sessions(
    tenant: TenantPrincipal,
    sessions: SessionsDep,
    include_closed: bool = False,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> list[Session]:
    return await sessions.list_for_tenant(
        tenant.tenant_id, include_closed=include_closed, limit=limit
    )


@router.get("/{session_id}", response_model=Session, responses=errors(*AUTH, 404))
async def get_session(
    session_id: SessionId, tenant: TenantPrincipal, sessions: SessionsDep
) -> Session:
    return await sessions.get(tenant.tenant_id, session_id)


@router.delete("/{session_id}", response_model=Session, responses=errors(*AUTH, 404))
async def delete_session(
    session_id: SessionId, tenant: TenantPrincipal, sessions: SessionsDep
) -> Session:
    """Close the session and free the GPU; forwards in flight are answered 409."""
    return await sessions.delete(tenant.tenant_id, session_id)


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"a forward body may be at most {limit} bytes")
    pieces: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"a forward body may be at most {limit} bytes")
        pieces.append(chunk)
    return b"".join(pieces)


@router.post(
    "/{session_id}/forward",
    response_class=Response,
    responses={
        200: {
            "description": "The outputs, in the encoding of the request",
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                "application/json": {"example": {"outputs": {"label": [7]}}},
            },
        },
        **errors(*AUTH, 404, 409, 410, 413, 422, 503),
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                "application/json": {"example": {"inputs": {"input": [[0.0] * 4]}}},
            },
        }
    },
)
async def forward(
    session_id: SessionId,
    request: Request,
    tenant: TenantPrincipal,
    replica: ReplicaDep,
    sessions: SessionsDep,
) -> Response:
    """Run the loaded model: an NPZ body answers NPZ; JSON `{"inputs": …}` answers JSON."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    fmt = "json" if content_type == "application/json" else "npz"
    payload = await read_body(request, replica.settings.max_forward_bytes)
    answer = await sessions.forward(tenant.tenant_id, session_id, fmt, payload)
    media = "application/json" if answer.format == "json" else "application/octet-stream"
    return Response(answer.body, media_type=media)
