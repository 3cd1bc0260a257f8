"""Tenant invokes (SPEC §1.5)."""

from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse

from gpu_share.coordinator.api.auth import TenantPrincipal
from gpu_share.coordinator.api.paths import InvokeId
from gpu_share.coordinator.api.prefer import wait_preference
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.http.replica import ReplicaDep, origins
from gpu_share.coordinator.replica.notify import Channel
from gpu_share.coordinator.services.work import invokes, probing
from gpu_share.protocol.common import Page
from gpu_share.protocol.invokes import (
    HELLO_WORLD,
    Invoke,
    InvokeCreate,
    InvokeStatus,
    ProbeUrlRequest,
    ProbeUrlResult,
)

router = APIRouter(prefix="/v1/gpu", tags=["invokes"])


@router.post(
    "/invoke",
    status_code=202,
    response_model=Invoke,
    responses={
        200: {
            "model": Invoke,
            "description": "With `Prefer: wait=N`: the invoke ended within N seconds; this "
            "is its final state (a 202 means it had not, and is answered as without it)",
        },
        **errors(*AUTH, 404, 409, 410, 422, 503),
    },
    openapi_extra={
        "requestBody": {"content": {"application/json": {"example": HELLO_WORLD}}},
    },
)
async def create_invoke(
    body: InvokeCreate,
    request: Request,
    tenant: TenantPrincipal,
    replica: ReplicaDep,
    idempotency_key: Annotated[
        str | None,
        Header(
            max_length=255,
            description="Same key + same body → the same invoke; same key + other body → 409",
        ),
    ] = None,
    prefer: Annotated[
        list[str] | None,
        Header(
            description="RFC 7240. `wait=N` (0–60): hold the answer until the invoke ends, "
            "for up to N seconds; it is then a 200 with the final invoke, else the usual "
            "202. A bare `wait` holds up to 60 s. Other preferences are ignored",
            examples=["wait=10"],
        ),
    ] = None,
) -> JSONResponse:
    """Queue a job; poll `GET /v1/gpu/invokes/{id}` until done, failed, timeout or canceled,
    or ask with `Prefer: wait=N` for the finished invoke in this answer."""
    wait = wait_preference(prefer, invokes.MAX_WAIT_SEC)
    invoke, created = await invokes.create(
        replica.db,
        replica.settings,
        tenant.tenant_id,
        body,
        idempotency_key=idempotency_key,
        origins=origins(replica, request),
        now=replica.clock.now(),
    )
    if created:  # other replicas heard it at the commit (`invokes.create`)
        replica.notifier.told_by_commit(Channel.WORK)
    headers = {"Location": f"/v1/gpu/invokes/{invoke.id}"}
    if not created:
        headers["Idempotent-Replayed"] = "true"
    if wait is not None:
        headers["Preference-Applied"] = f"wait={wait}"
        if wait > 0 and not invoke.status.terminal:
            invoke = await invokes.wait_until_final(
                replica.db, replica.notifier, tenant.tenant_id, invoke.id, wait
            )
    status = 200 if wait is not None and invoke.status.terminal else 202
    return JSONResponse(invoke.model_dump(mode="json"), status_code=status, headers=headers)


@router.get("/invokes", response_model=Page[Invoke], responses=errors(*AUTH, 422))
async def list_invokes(
    tenant: TenantPrincipal,
    replica: ReplicaDep,
    status: InvokeStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[str | None, Query(max_length=64)] = None,
) -> Page[Invoke]:
    """Your invokes, newest first."""
    async with replica.db.read() as session:
        items, next_cursor = await invokes.list_for_tenant(
            session, tenant.tenant_id, status=status, limit=limit, cursor=cursor
        )
    return Page[Invoke](items=items, next_cursor=next_cursor)


@router.get("/invokes/{invoke_id}", response_model=Invoke, responses=errors(*AUTH, 404, 422))
async def get_invoke(
    invoke_id: InvokeId,
    tenant: TenantPrincipal,
    replica: ReplicaDep,
    wait: Annotated[
        float,
        Query(
            ge=0,
            le=invokes.MAX_WAIT_SEC,
            description="Long-poll: answer as soon as the invoke is final, or after this many "
            "seconds with its current state",
        ),
    ] = 0,
) -> Invoke:
    """The invoke's status, result and error; poll it, or long-poll with `?wait=N`."""
    return await invokes.wait_until_final(
        replica.db, replica.notifier, tenant.tenant_id, invoke_id, wait
    )


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
    invoke_id: InvokeId,
    tenant: TenantPrincipal,
    replica: ReplicaDep,
    after: Annotated[int, Query(ge=0, le=2**53, description="Cursor from X-Log-Cursor")] = 0,
) -> Response:
    """The job's log (replica and agent lines), also while it runs."""
    async with replica.db.read() as session:
        text, cursor, status = await invokes.read_logs(session, tenant.tenant_id, invoke_id, after)
    return PlainTextResponse(
        text, headers={"X-Log-Cursor": str(cursor), "X-Invoke-Status": status.value}
    )


@router.post(
    "/invokes/{invoke_id}/cancel", response_model=Invoke, responses=errors(*AUTH, 404, 409)
)
async def cancel_invoke(
    invoke_id: InvokeId, tenant: TenantPrincipal, replica: ReplicaDep
) -> Invoke:
    """A queued invoke is canceled at once; a running one is stopped by its node shortly."""
    async with replica.db.write() as session:
        canceled = await invokes.cancel(
            session, tenant.tenant_id, invoke_id, replica.clock.now(), replica.settings
        )
    if canceled.status.terminal:
        await replica.notifier.publish(Channel.FINISHED, invoke_id)
    return canceled


@router.post("/probe-url", response_model=ProbeUrlResult, responses=errors(*AUTH, 422))
async def probe_url(
    body: ProbeUrlRequest, request: Request, tenant: TenantPrincipal, replica: ReplicaDep
) -> ProbeUrlResult:
    """Check a URL with the same rules the agent fetches with (public http(s) only)."""
    return await probing.probe(
        replica.db,
        replica.fetcher,
        tenant.tenant_id,
        body.url,
        origins=origins(replica, request),
        now=replica.clock.now(),
    )
