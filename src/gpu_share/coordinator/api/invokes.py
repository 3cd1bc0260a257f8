"""Tenant invokes (SPEC §1.5)."""

from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse

from gpu_share.coordinator.api.deps import RuntimeDep
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.auth import TenantPrincipal
from gpu_share.coordinator.services import invokes, probing
from gpu_share.protocol.common import Page
from gpu_share.protocol.invokes import (
    Invoke,
    InvokeCreate,
    InvokeStatus,
    ProbeUrlRequest,
    ProbeUrlResult,
)

router = APIRouter(prefix="/v1/gpu", tags=["invokes"])

HELLO_WORLD = {
    "runtime": "onnx_cuda",
    "model_url": "https://github.com/onnx/models/raw/main/validated/vision/classification/mnist/model/mnist-12.onnx",
    "inputs_url": "",
    "timeout_sec": 600,
}


@router.post(
    "/invoke",
    status_code=202,
    response_model=Invoke,
    responses=errors(*AUTH, 404, 409, 410, 422, 503),
    openapi_extra={
        "requestBody": {"content": {"application/json": {"example": HELLO_WORLD}}},
    },
)
async def create_invoke(
    body: InvokeCreate,
    request: Request,
    principal: TenantPrincipal,
    runtime: RuntimeDep,
    idempotency_key: Annotated[
        str | None,
        Header(
            max_length=255,
            description="Same key + same body → the same invoke; same key + other body → 409",
        ),
    ] = None,
) -> JSONResponse:
    """Queue a job; poll `GET /v1/gpu/invokes/{id}` until done, failed, timeout or canceled."""
    assert principal.tenant_id is not None
    invoke, created = await invokes.create(
        runtime.db,
        runtime.settings,
        principal.tenant_id,
        body,
        idempotency_key=idempotency_key,
        origins=invokes.origins_of(runtime.settings.public_base_url, str(request.base_url)),
        now=runtime.clock.now(),
    )
    if created:
        await runtime.notifier.publish()
    headers = {"Location": f"/v1/gpu/invokes/{invoke.id}"}
    if not created:
        headers["Idempotent-Replayed"] = "true"
    return JSONResponse(invoke.model_dump(mode="json"), status_code=202, headers=headers)


@router.get("/invokes", response_model=Page[Invoke], responses=errors(*AUTH, 422))
async def list_invokes(
    principal: TenantPrincipal,
    runtime: RuntimeDep,
    status: InvokeStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[str | None, Query(max_length=64)] = None,
) -> Page[Invoke]:
    """Your invokes, newest first."""
    assert principal.tenant_id is not None
    async with runtime.db.read() as session:
        items, next_cursor = await invokes.list_for_tenant(
            session, principal.tenant_id, status=status, limit=limit, cursor=cursor
        )
    return Page[Invoke](items=items, next_cursor=next_cursor)


@router.get("/invokes/{invoke_id}", response_model=Invoke, responses=errors(*AUTH, 404))
async def get_invoke(invoke_id: str, principal: TenantPrincipal, runtime: RuntimeDep) -> Invoke:
    assert principal.tenant_id is not None
    async with runtime.db.read() as session:
        return invokes.to_wire(await invokes.owned(session, principal.tenant_id, invoke_id))


@router.get(
    "/invokes/{invoke_id}/logs",
    response_class=PlainTextResponse,
    responses={
        200: {
            "content": {"text/plain": {}},
            "description": "Log text after `after`; `X-Log-Cursor` is the next `after`, "
            "`X-Invoke-Status` tells a follower when to stop",
        },
        **errors(*AUTH, 404, 422),
    },
)
async def get_logs(
    invoke_id: str,
    principal: TenantPrincipal,
    runtime: RuntimeDep,
    after: Annotated[int, Query(ge=0, description="Cursor from X-Log-Cursor")] = 0,
) -> Response:
    """The job's log (runtime and agent lines), also while it runs."""
    assert principal.tenant_id is not None
    async with runtime.db.read() as session:
        text, cursor, status = await invokes.read_logs(
            session, principal.tenant_id, invoke_id, after
        )
    return PlainTextResponse(
        text, headers={"X-Log-Cursor": str(cursor), "X-Invoke-Status": status.value}
    )


@router.post(
    "/invokes/{invoke_id}/cancel", response_model=Invoke, responses=errors(*AUTH, 404, 409)
)
async def cancel_invoke(invoke_id: str, principal: TenantPrincipal, runtime: RuntimeDep) -> Invoke:
    """A queued invoke is canceled at once; a running one is stopped by its node shortly."""
    assert principal.tenant_id is not None
    async with runtime.db.write() as session:
        return await invokes.cancel(session, principal.tenant_id, invoke_id, runtime.clock.now())


@router.post("/probe-url", response_model=ProbeUrlResult, responses=errors(*AUTH, 422))
async def probe_url(
    body: ProbeUrlRequest, request: Request, principal: TenantPrincipal, runtime: RuntimeDep
) -> ProbeUrlResult:
    """Check a URL with the same rules the agent fetches with (public http(s) only)."""
    assert principal.tenant_id is not None
    return await probing.probe(
        runtime,
        principal.tenant_id,
        body.url,
        origins=invokes.origins_of(runtime.settings.public_base_url, str(request.base_url)),
    )
