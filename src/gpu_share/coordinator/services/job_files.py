"""Files an agent produces for a leased invoke: large outputs and training checkpoints.

Both are stored as artifacts of the invoke's tenant (they are the tenant's data) and
do not count against the upload quota. A checkpoint replaces the previous one; a
requeued attempt is leased with the newest.
"""

import contextlib
from collections.abc import AsyncIterator
from datetime import datetime

from gpu_share.coordinator.errors import Conflict, NotFound
from gpu_share.coordinator.runtime import Runtime
from gpu_share.coordinator.services import artifacts, leases
from gpu_share.protocol.artifacts import Artifact, ArtifactKind


async def store(
    runtime: Runtime,
    *,
    node_id: str,
    invoke_id: str,
    lease_token: str,
    kind: ArtifactKind,
    chunks: AsyncIterator[bytes],
    content_sha256: str | None,
    now: datetime,
    base_url: str,
) -> tuple[Artifact, str]:
    """Stream the file into the tenant's artifacts; returns it and the tenant's id."""
    async with runtime.db.read() as session:
        row = await leases.leased_invoke(session, node_id, invoke_id, lease_token)
    stored = await artifacts.upload(
        runtime.db,
        runtime.store,
        runtime.settings,
        artifacts.UploadRequest(
            tenant_id=row.tenant_id,
            kind=kind,
            content_sha256=content_sha256,
            declared_length=None,
            enforce_quota=False,
        ),
        chunks,
        now,
        base_url,
    )
    return stored, row.tenant_id


async def store_checkpoint(
    runtime: Runtime,
    *,
    node_id: str,
    invoke_id: str,
    lease_token: str,
    chunks: AsyncIterator[bytes],
    content_sha256: str | None,
    now: datetime,
    base_url: str,
) -> Artifact:
    stored, tenant_id = await store(
        runtime,
        node_id=node_id,
        invoke_id=invoke_id,
        lease_token=lease_token,
        kind=ArtifactKind.CHECKPOINT,
        chunks=chunks,
        content_sha256=content_sha256,
        now=now,
        base_url=base_url,
    )
    try:
        async with runtime.db.write() as session:
            replaced = await leases.record_checkpoint(
                session, node_id, invoke_id, lease_token, stored.id
            )
    except Conflict:  # the lease went stale while the snapshot streamed in
        await artifacts.delete_artifact(runtime.db, runtime.store, tenant_id, stored.id)
        raise
    if replaced is not None and replaced != stored.id:
        with contextlib.suppress(NotFound):
            await artifacts.delete_artifact(runtime.db, runtime.store, tenant_id, replaced)
    return stored
