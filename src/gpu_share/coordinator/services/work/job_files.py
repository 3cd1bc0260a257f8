"""Files an agent produces for a leased invoke: large outputs and training checkpoints.

Both are stored as artifacts of the invoke's tenant (they are the tenant's data) and
count against the tenant's quota like uploads: one that does not fit is refused with
413 QUOTA_EXCEEDED, and the tenant can delete old outputs to make room. A checkpoint
must be one its runtime writes (`checkpoint_formats`: a preempted attempt is charged up
to it), else 422 and nothing is stored; it replaces the previous one, and a requeued
attempt is leased with the newest.
"""

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime

from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.errors import Conflict, NotFound
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.artifacts import artifacts
from gpu_share.coordinator.services.work import checkpoint_formats, leases
from gpu_share.coordinator.services.work.invoke_state import Lease
from gpu_share.coordinator.storage import ArtifactStore
from gpu_share.protocol.artifacts import Artifact, ArtifactKind
from gpu_share.protocol.runtimes import RuntimeName


@dataclass(frozen=True)
class JobFileStore:
    db: Database
    store: ArtifactStore
    settings: Settings


async def store(
    files: JobFileStore,
    lease: Lease,
    kind: ArtifactKind,
    chunks: AsyncIterator[bytes],
    *,
    content_sha256: str | None,
    now: datetime,
    base_url: str,
) -> tuple[Artifact, str]:
    """Stream the file into the tenant's artifacts; returns it and the tenant's id."""
    async with files.db.read() as session:
        row = await leases.leased_invoke(session, lease)
    stored = await artifacts.upload(
        files.db,
        files.store,
        files.settings,
        artifacts.UploadRequest(
            tenant_id=row.tenant_id,
            kind=kind,
            content_sha256=content_sha256,
            declared_length=None,
        ),
        chunks,
        now,
        base_url,
    )
    return stored, row.tenant_id


async def store_checkpoint(
    files: JobFileStore,
    lease: Lease,
    chunks: AsyncIterator[bytes],
    *,
    content_sha256: str | None,
    now: datetime,
    base_url: str,
) -> Artifact:
    async with files.db.read() as session:
        runtime = RuntimeName((await leases.leased_invoke(session, lease)).runtime)
    stored, tenant_id = await store(
        files,
        lease,
        ArtifactKind.CHECKPOINT,
        await checkpoint_formats.checked(runtime, chunks),
        content_sha256=content_sha256,
        now=now,
        base_url=base_url,
    )
    try:
        async with files.db.write() as session:
            replaced = await leases.record_checkpoint(session, lease, stored.id)
    except Conflict:  # the lease went stale while the snapshot streamed in
        await artifacts.delete_artifact(files.db, files.store, tenant_id, stored.id)
        raise
    if replaced is not None and replaced != stored.id:
        with contextlib.suppress(NotFound):
            await artifacts.delete_artifact(files.db, files.store, tenant_id, replaced)
    return stored
