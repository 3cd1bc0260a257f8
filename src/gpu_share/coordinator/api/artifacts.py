"""Hosted uploads for tenants (SPEC §1.3): the body streams straight to storage."""

import asyncio
from collections.abc import AsyncIterator
from enum import StrEnum
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import FileResponse, StreamingResponse
from starlette.concurrency import iterate_in_threadpool

from gpu_share.coordinator.api.deps import RuntimeDep, base_url
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.auth import TenantPrincipal, current_principal, require
from gpu_share.coordinator.errors import field_error
from gpu_share.coordinator.runtime import Runtime
from gpu_share.coordinator.services import artifacts
from gpu_share.protocol.accounts import Role
from gpu_share.protocol.artifacts import Artifact, ArtifactKind
from gpu_share.protocol.common import Page, Sha256Hex

router = APIRouter(prefix="/v1/artifacts", tags=["artifacts"])


class UploadKind(StrEnum):
    MODEL = "model"
    INPUTS = "inputs"
    CONFIG = "config"


def declared_length(request: Request) -> int | None:
    raw = request.headers.get("content-length")
    if raw is None:
        return None
    if not raw.isdigit():
        raise field_error("Content-Length", "must be a non-negative integer")
    return int(raw)


@router.post(
    "",
    status_code=201,
    response_model=Artifact,
    responses=errors(*AUTH, 413, 422),
    openapi_extra={
        "requestBody": {
            "required": True,
            "description": "The file's bytes, streamed; any Content-Type is accepted",
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        }
    },
)
async def upload_artifact(
    request: Request,
    principal: TenantPrincipal,
    runtime: RuntimeDep,
    kind: Annotated[UploadKind, Query(description="What the file is: model, inputs or config")],
    content_sha256: Annotated[
        Sha256Hex | None,
        Query(
            description="SHA-256 of the body, hex; verified, required when CHECKSUM_MODE=enforce"
        ),
    ] = None,
) -> Artifact:
    """Upload a model, inputs or config; use the returned `url` as `model_url` or `inputs_url`."""
    assert principal.tenant_id is not None
    upload = artifacts.UploadRequest(
        tenant_id=principal.tenant_id,
        kind=ArtifactKind(kind.value),
        content_sha256=content_sha256,
        declared_length=declared_length(request),
    )
    return await artifacts.upload(
        runtime.db,
        runtime.store,
        runtime.settings,
        upload,
        request.stream(),
        runtime.clock.now(),
        base_url(runtime, request),
    )


@router.get("", response_model=Page[Artifact], responses=errors(*AUTH, 422))
async def list_artifacts(
    request: Request,
    principal: TenantPrincipal,
    runtime: RuntimeDep,
    kind: ArtifactKind | None = None,
    sha256: Sha256Hex | None = None,
    include_expired: bool = False,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[str | None, Query(max_length=64)] = None,
) -> Page[Artifact]:
    """Your artifacts, newest first; filter by kind or content hash."""
    assert principal.tenant_id is not None
    async with runtime.db.read() as session:
        items, next_cursor = await artifacts.list_for_tenant(
            session,
            principal.tenant_id,
            runtime.clock.now(),
            base_url(runtime, request),
            kind=kind,
            sha256=sha256,
            include_expired=include_expired,
            limit=limit,
            cursor=cursor,
        )
    return Page[Artifact](items=items, next_cursor=next_cursor)


@router.get("/{artifact_id}", response_model=Artifact, responses=errors(*AUTH, 404))
async def get_artifact(
    artifact_id: str, request: Request, principal: TenantPrincipal, runtime: RuntimeDep
) -> Artifact:
    assert principal.tenant_id is not None
    async with runtime.db.read() as session:
        return await artifacts.get(
            session, principal.tenant_id, artifact_id, base_url(runtime, request)
        )


@router.get(
    "/{artifact_id}/download",
    response_class=Response,
    responses={
        200: {
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            }
        },
        **errors(*AUTH, 404, 410),
    },
)
async def download_artifact(
    artifact_id: str,
    request: Request,
    runtime: RuntimeDep,
    token: Annotated[
        str | None,
        Query(
            max_length=200, description="Signed token in URLs handed to agents (instead of a key)"
        ),
    ] = None,
) -> Response:
    """The exact bytes uploaded; `410 ARTIFACT_EXPIRED` after the artifact's TTL."""
    now = runtime.clock.now()
    if token is not None:
        runtime.signer.verify(token, artifact_id, now)
        async with runtime.db.read() as session:
            download = await artifacts.open_signed_download(session, artifact_id, now)
    else:
        principal = await require(Role.TENANT)(await current_principal(request, runtime))
        assert principal.tenant_id is not None
        async with runtime.db.read() as session:
            download = await artifacts.open_download(
                session, artifact_id, now, tenant_id=principal.tenant_id
            )
    return await stream_download(runtime, download)


async def stream_download(runtime: Runtime, download: artifacts.Download) -> Response:
    headers = {
        "ETag": f'"{download.artifact.sha256}"',
        "X-Content-SHA256": download.artifact.sha256,
        "Cache-Control": "private, max-age=0",
    }
    path = runtime.store.local_path(download.storage_key)
    if path is not None and await asyncio.to_thread(path.is_file):
        return FileResponse(path, media_type="application/octet-stream", headers=headers)
    chunks: AsyncIterator[bytes] = iterate_in_threadpool(runtime.store.read(download.storage_key))
    headers["Content-Length"] = str(download.artifact.size)
    return StreamingResponse(chunks, media_type="application/octet-stream", headers=headers)


@router.delete("/{artifact_id}", status_code=204, responses=errors(*AUTH, 404))
async def delete_artifact(
    artifact_id: str, principal: TenantPrincipal, runtime: RuntimeDep
) -> Response:
    """Delete the artifact; its bytes go once no other artifact shares them."""
    assert principal.tenant_id is not None
    await artifacts.delete_artifact(runtime.db, runtime.store, principal.tenant_id, artifact_id)
    return Response(status_code=204)
