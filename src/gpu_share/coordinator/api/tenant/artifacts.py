"""Hosted uploads for tenants (SPEC §1.3): the body streams straight to storage."""

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from gpu_share.coordinator.api.auth import ArtifactReader, SignedLink, TenantPrincipal
from gpu_share.coordinator.api.paths import ArtifactId
from gpu_share.coordinator.api.responses import AUTH, errors
from gpu_share.coordinator.http.artifacts import UploadKind, declared_length, stream_download
from gpu_share.coordinator.http.replica import ReplicaDep, base_url
from gpu_share.coordinator.services.artifacts import artifacts
from gpu_share.protocol.artifacts import Artifact, ArtifactKind
from gpu_share.protocol.common import Page, Sha256Hex

router = APIRouter(prefix="/v1/artifacts", tags=["artifacts"])


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
    tenant: TenantPrincipal,
    replica: ReplicaDep,
    kind: Annotated[
        UploadKind,
        Query(
            description="What the file is: model (an ONNX file), inputs (an NPZ archive) or "
            "config (a CatBoost train config, JSON)"
        ),
    ],
    content_sha256: Annotated[
        Sha256Hex | None,
        Query(
            description="SHA-256 of the body, hex; verified, required when CHECKSUM_MODE=enforce"
        ),
    ] = None,
    name: Annotated[
        str | None,
        Query(
            max_length=1024,
            description="The file's name, shown in the console and returned as `name`: "
            "1–200 printable characters once trimmed; any directory part is dropped "
            "(`runs/7/model.onnx` is kept as `model.onnx`)",
        ),
    ] = None,
) -> Artifact:
    """Upload a model, inputs or config; use the returned `url` as `model_url` or `inputs_url`.

    The file is checked for what its kind promises before anything is kept: a model must
    be an ONNX model (its inputs and outputs come back as `signature`), inputs an NPZ
    archive numpy can read, a config a CatBoost train config. Otherwise `422
    VALIDATION_ERROR` says what is wrong and what to send; nothing is stored and no quota
    is used.

    Each upload is an artifact of its own with its own `name`, even when its bytes are
    already stored for another (they are kept once): uploading the same file again under
    another name lists it under both names.
    """
    upload = artifacts.UploadRequest(
        tenant_id=tenant.tenant_id,
        kind=ArtifactKind(kind.value),
        content_sha256=content_sha256,
        declared_length=declared_length(request),
        name=name,
    )
    return await artifacts.upload(
        replica.db,
        replica.store,
        replica.settings,
        upload,
        request.stream(),
        replica.clock.now(),
        base_url(replica, request),
    )


@router.get("", response_model=Page[Artifact], responses=errors(*AUTH, 422))
async def list_artifacts(
    request: Request,
    tenant: TenantPrincipal,
    replica: ReplicaDep,
    kind: ArtifactKind | None = None,
    sha256: Sha256Hex | None = None,
    include_expired: bool = False,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[str | None, Query(max_length=64)] = None,
) -> Page[Artifact]:
    """Your artifacts, newest first; filter by kind or content hash."""
    async with replica.db.read() as session:
        items, next_cursor = await artifacts.list_for_tenant(
            session,
            tenant.tenant_id,
            replica.clock.now(),
            base_url(replica, request),
            kind=kind,
            sha256=sha256,
            include_expired=include_expired,
            limit=limit,
            cursor=cursor,
        )
    return Page[Artifact](items=items, next_cursor=next_cursor)


@router.get("/{artifact_id}", response_model=Artifact, responses=errors(*AUTH, 404))
async def get_artifact(
    artifact_id: ArtifactId, request: Request, tenant: TenantPrincipal, replica: ReplicaDep
) -> Artifact:
    async with replica.db.read() as session:
        return await artifacts.get(
            session, tenant.tenant_id, artifact_id, base_url(replica, request)
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
    artifact_id: ArtifactId, reader: ArtifactReader, replica: ReplicaDep
) -> Response:
    """The exact bytes uploaded; `410 ARTIFACT_EXPIRED` after the artifact's TTL."""
    now = replica.clock.now()
    async with replica.db.read() as session:
        if isinstance(reader, SignedLink):
            download = await artifacts.open_signed_download(session, artifact_id, now)
        else:
            download = await artifacts.open_download(
                session, artifact_id, now, tenant_id=reader.tenant_id
            )
    return await stream_download(replica, download)


@router.delete("/{artifact_id}", status_code=204, responses=errors(*AUTH, 404))
async def delete_artifact(
    artifact_id: ArtifactId, tenant: TenantPrincipal, replica: ReplicaDep
) -> Response:
    """Delete the artifact; its bytes go once no other artifact shares them."""
    await artifacts.delete_artifact(replica.db, replica.store, tenant.tenant_id, artifact_id)
    return Response(status_code=204)
