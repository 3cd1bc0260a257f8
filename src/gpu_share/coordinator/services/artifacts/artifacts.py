"""Hosted artifacts: streaming upload with hashing and quota, download, expiry, deletion.

Bytes are stored once per distinct SHA-256 (a blob) and shared by every artifact
with that content, whoever owns it. The order of an upload is: stream into a
temporary object while hashing → check size, checksum, then the content against what
its kind promises (`upload_checks`, read back from the temporary object, whether or not
a blob already holds these bytes) → publish the object under a fresh key (outside any
transaction) → one write transaction that re-checks the quota under the tenant's row
lock and records the artifact → delete what turned out not to be needed. Any failure on
the way deletes the temporary or fresh object, so nothing is stored and the quota is
unchanged.

Every upload is an artifact of its own, with its own id, name and expiry, even when a
blob already holds its bytes: the same file uploaded again under another name is listed
under both names (the SDK's `reuse` looks for a live one first; see `sdk._api`).
"""

import asyncio
import hashlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from sqlalchemy import delete, exists, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.errors import (
    Gone,
    NotFound,
    PayloadTooLarge,
    Unavailable,
    ValidationFailed,
    field_error,
)
from gpu_share.coordinator.core.ids import checked_cursor, new_id
from gpu_share.coordinator.core.orm import ArtifactRow, BlobRow, TenantRow
from gpu_share.coordinator.core.settings import ChecksumMode, Settings
from gpu_share.coordinator.services.artifacts import upload_checks
from gpu_share.coordinator.storage import ArtifactStore, UploadSink
from gpu_share.protocol.artifacts import Artifact, ArtifactKind, ModelSignature
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.names import file_name

log = logging.getLogger(__name__)

FLUSH_BYTES = 1 << 20  # hash and write in 1 MiB pieces, off the event loop
TOMBSTONE_DAYS = 7  # expired artifacts answer 410 (not 404) this long


@dataclass(frozen=True)
class UploadRequest:
    tenant_id: str
    kind: ArtifactKind
    content_sha256: str | None
    declared_length: int | None
    name: str | None = None  # as sent; checked by `upload` (`protocol.names.file_name`)


def checked_name(raw: str) -> str:
    """The file name to keep, any directory part dropped; 422 naming what is wrong."""
    try:
        return file_name(raw)
    except ValueError as error:
        raise field_error(
            "name", f"{error}; send the file's own name, e.g. ?name=model.onnx"
        ) from None


def artifact_url(base_url: str, artifact_id: str) -> str:
    return f"{base_url}/v1/artifacts/{artifact_id}/download"


def to_wire(row: ArtifactRow, base_url: str) -> Artifact:
    return Artifact(
        id=row.id,
        name=row.name,
        url=artifact_url(base_url, row.id),
        kind=ArtifactKind(row.kind),
        size=row.size,
        sha256=row.sha256,
        created_at=row.created_at,
        expires_at=row.expires_at,
        signature=ModelSignature.model_validate(row.signature) if row.signature else None,
    )


async def tenant_usage(session: AsyncSession, tenant_id: str, now: datetime) -> int:
    total = await session.scalar(
        select(func.coalesce(func.sum(ArtifactRow.size), 0)).where(
            ArtifactRow.tenant_id == tenant_id, ArtifactRow.expires_at > now
        )
    )
    return int(total or 0)


def _quota_error(quota: int, used: int, size: int | None) -> PayloadTooLarge:
    wanted = f"{size} more bytes" if size is not None else "more bytes"
    return PayloadTooLarge(
        f"artifact quota exceeded: {used} of {quota} bytes in use, upload needs {wanted}; "
        "delete artifacts you no longer need or wait for them to expire",
        code=ErrorCode.QUOTA_EXCEEDED,
        details={"quota_bytes": quota, "used_bytes": used},
    )


def upload_limit(settings: Settings, kind: ArtifactKind) -> int:
    """The most bytes an artifact of `kind` may have: the configured limit, and for a
    config no more than a train config is read whole to be checked (`upload_checks`)."""
    limit = settings.max_upload_bytes(kind.value)
    if kind is ArtifactKind.CONFIG:
        return min(limit, upload_checks.CONFIG_MAX_BYTES)
    return limit


def _size_error(kind: ArtifactKind, limit: int) -> PayloadTooLarge:
    hint = (
        "; a CatBoost train config holds parameters, the data goes in the inputs NPZ (kind=inputs)"
        if kind is ArtifactKind.CONFIG
        else ""
    )
    return PayloadTooLarge(
        f"a {kind.value} artifact may be at most {limit} bytes{hint}",
        details={"limit_bytes": limit, "kind": kind.value},
    )


class _HashingWriter:
    """Feeds each piece to SHA-256 and the sink, in a worker thread, one piece in flight."""

    def __init__(self, sink: UploadSink) -> None:
        self.sink = sink
        self.hasher = hashlib.sha256()
        self._pending: asyncio.Future[None] | None = None

    def _absorb(self, data: bytes) -> None:
        self.hasher.update(data)
        self.sink.write(data)

    async def write(self, data: bytes) -> None:
        await self.drain()
        self._pending = asyncio.ensure_future(asyncio.to_thread(self._absorb, data))

    async def drain(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            await pending

    async def drain_quietly(self) -> None:
        """Let the piece in flight finish before the sink is discarded; its error is moot."""
        try:
            await self.drain()
        except Exception:
            log.debug("write in flight failed while the upload was being abandoned", exc_info=True)


async def upload(
    db: Database,
    store: ArtifactStore,
    settings: Settings,
    request: UploadRequest,
    chunks: AsyncIterator[bytes],
    now: datetime,
    base_url: str,
) -> Artifact:
    if settings.checksum_mode is ChecksumMode.ENFORCE and request.content_sha256 is None:
        raise field_error(
            "content_sha256",
            "required while the server enforces checksums (CHECKSUM_MODE=enforce); "
            "pass the SHA-256 of the body as ?content_sha256=HEX",
        )
    if request.name is not None:
        request = replace(request, name=checked_name(request.name))
    limit = upload_limit(settings, request.kind)
    quota = settings.tenant_quota_bytes  # uploads, job outputs and checkpoints alike
    if request.declared_length is not None and request.declared_length > limit:
        raise _size_error(request.kind, limit)
    async with db.read() as session:
        used = await tenant_usage(session, request.tenant_id, now)
    room = quota - used
    if request.declared_length is not None and request.declared_length > room:
        raise _quota_error(quota, used, request.declared_length)

    sink = await asyncio.to_thread(store.begin_upload)
    writer = _HashingWriter(sink)
    try:
        size = await _receive(
            chunks, writer, limit=limit, room=room, kind=request.kind, quota=quota, used=used
        )
        digest = writer.hasher.hexdigest()
        if request.content_sha256 is not None and digest != request.content_sha256:
            raise ValidationFailed(
                f"the body's SHA-256 is {digest}, not the content_sha256 given "
                f"({request.content_sha256}); the upload was corrupted or the checksum is wrong",
                code=ErrorCode.CHECKSUM_MISMATCH,
                details={"expected": request.content_sha256, "actual": digest},
            )
        signature = await _checked(sink, request.kind, size)
        row = await _record(
            db,
            store,
            sink,
            request,
            digest=digest,
            size=size,
            now=now,
            settings=settings,
            signature=signature,
        )
    except BaseException:
        await writer.drain_quietly()
        raise
    finally:
        await asyncio.to_thread(sink.abort)  # discards what was not published; else a no-op
    return to_wire(row, base_url)


async def _receive(
    chunks: AsyncIterator[bytes],
    writer: _HashingWriter,
    *,
    limit: int,
    room: int,
    kind: ArtifactKind,
    quota: int,
    used: int,
) -> int:
    size = 0
    pieces: list[bytes] = []
    buffered = 0
    async for chunk in chunks:
        if not chunk:
            continue
        size += len(chunk)
        if size > limit:
            raise _size_error(kind, limit)
        if size > room:
            raise _quota_error(quota, used, size)
        pieces.append(chunk)
        buffered += len(chunk)
        if buffered >= FLUSH_BYTES:
            await writer.write(b"".join(pieces))
            pieces, buffered = [], 0
    if pieces:
        await writer.write(b"".join(pieces))
    await writer.drain()
    return size


async def _checked(sink: UploadSink, kind: ArtifactKind, size: int) -> ModelSignature | None:
    """The upload judged against its kind (`upload_checks`), off the event loop."""
    if kind not in upload_checks.CHECKED_KINDS:
        return None

    def check() -> ModelSignature | None:
        with sink.read_back() as file:
            return upload_checks.check(kind, file, size)

    return await asyncio.to_thread(check)


async def _record(
    db: Database,
    store: ArtifactStore,
    sink: UploadSink,
    request: UploadRequest,
    *,
    digest: str,
    size: int,
    now: datetime,
    settings: Settings,
    signature: ModelSignature | None,
) -> ArtifactRow:
    """Write the artifact row, publishing the bytes first unless a blob already has them.

    An object this call published is deleted again when it ends up unused (another
    blob had the same bytes) or when the transaction fails.
    """
    published: tuple[str, str] | None = None  # (blob id, storage key)
    used_ours = False
    try:
        async with db.read() as session:
            blob_known = await session.scalar(select(BlobRow.id).where(BlobRow.sha256 == digest))
        for _attempt in range(4):
            if not blob_known and published is None:
                blob_id = new_id("blob")
                key = f"{digest}-{blob_id}"
                await asyncio.to_thread(store.commit, sink, key)
                published = (blob_id, key)
            try:
                async with db.write() as session:
                    row, ours = await _insert_artifact(
                        session,
                        request,
                        digest=digest,
                        size=size,
                        now=now,
                        settings=settings,
                        published=published,
                        signature=signature,
                    )
                used_ours = ours  # only once the transaction has committed
            except IntegrityError:
                # Another upload recorded a blob with these bytes between our read and
                # our write: look again and reuse it.
                async with db.read() as session:
                    blob_known = await session.scalar(
                        select(BlobRow.id).where(BlobRow.sha256 == digest)
                    )
                continue
            if row is None:  # the blob we meant to reuse was collected meanwhile
                blob_known = None
                continue
            return row
        raise Unavailable("the artifact could not be recorded under concurrent uploads; retry")
    finally:
        if published is not None and not used_ours:
            await asyncio.to_thread(store.delete, published[1])


async def _insert_artifact(
    session: AsyncSession,
    request: UploadRequest,
    *,
    digest: str,
    size: int,
    now: datetime,
    settings: Settings,
    published: tuple[str, str] | None,
    signature: ModelSignature | None,
) -> tuple[ArtifactRow | None, bool]:
    # The tenant's row lock serializes the quota check of concurrent uploads.
    await session.execute(
        select(TenantRow.id).where(TenantRow.id == request.tenant_id).with_for_update()
    )
    used = await tenant_usage(session, request.tenant_id, now)
    if used + size > settings.tenant_quota_bytes:
        raise _quota_error(settings.tenant_quota_bytes, used, size)
    blob = await session.scalar(select(BlobRow).where(BlobRow.sha256 == digest).with_for_update())
    used_ours = False
    if blob is None:
        if published is None:
            return None, False
        blob = BlobRow(
            id=published[0], sha256=digest, size=size, storage_key=published[1], created_at=now
        )
        session.add(blob)
        await session.flush()  # the artifact's foreign key needs the blob row first
        used_ours = True
    row = ArtifactRow(
        id=new_id("art"),
        tenant_id=request.tenant_id,
        kind=request.kind.value,
        size=size,
        sha256=digest,
        blob_id=blob.id,
        created_at=now,
        expires_at=now + timedelta(seconds=settings.artifact_ttl_sec),
        signature=signature.model_dump(mode="json") if signature else None,
        name=request.name,
    )
    session.add(row)
    await session.flush()
    return row, used_ours


async def _owned(session: AsyncSession, tenant_id: str, artifact_id: str) -> ArtifactRow:
    row = await session.get(ArtifactRow, artifact_id)
    if row is None or row.tenant_id != tenant_id:
        raise NotFound(f"artifact {artifact_id} does not exist")
    return row


def _expired(row: ArtifactRow) -> Gone:
    return Gone(
        f"artifact {row.id} expired at {row.expires_at.isoformat()}; upload it again",
        code=ErrorCode.ARTIFACT_EXPIRED,
    )


@dataclass(frozen=True)
class Download:
    artifact: ArtifactRow
    storage_key: str


async def open_download(
    session: AsyncSession, artifact_id: str, now: datetime, *, tenant_id: str
) -> Download:
    row = await _owned(session, tenant_id, artifact_id)
    return await _download(session, row, now)


async def open_signed_download(session: AsyncSession, artifact_id: str, now: datetime) -> Download:
    """For a holder of a signed link (an agent running a job that uses the artifact)."""
    row = await session.get(ArtifactRow, artifact_id)
    if row is None:
        raise NotFound(f"artifact {artifact_id} does not exist")
    return await _download(session, row, now)


async def _download(session: AsyncSession, row: ArtifactRow, now: datetime) -> Download:
    if row.expires_at <= now or row.blob_id is None:
        raise _expired(row)
    blob = await session.get(BlobRow, row.blob_id)
    if blob is None:  # cannot happen while the row references it (foreign key)
        raise _expired(row)
    return Download(artifact=row, storage_key=blob.storage_key)


async def get(session: AsyncSession, tenant_id: str, artifact_id: str, base_url: str) -> Artifact:
    return to_wire(await _owned(session, tenant_id, artifact_id), base_url)


async def list_for_tenant(
    session: AsyncSession,
    tenant_id: str,
    now: datetime,
    base_url: str,
    *,
    kind: ArtifactKind | None = None,
    sha256: str | None = None,
    include_expired: bool = False,
    limit: int = 50,
    cursor: str | None = None,
) -> tuple[list[Artifact], str | None]:
    query = select(ArtifactRow).where(ArtifactRow.tenant_id == tenant_id)
    if not include_expired:
        query = query.where(ArtifactRow.expires_at > now)
    if kind is not None:
        query = query.where(ArtifactRow.kind == kind.value)
    if sha256 is not None:
        query = query.where(ArtifactRow.sha256 == sha256)
    if checked_cursor("art", cursor):
        query = query.where(ArtifactRow.id < cursor)
    rows = (await session.scalars(query.order_by(ArtifactRow.id.desc()).limit(limit + 1))).all()
    next_cursor = rows[limit - 1].id if len(rows) > limit else None
    return [to_wire(row, base_url) for row in rows[:limit]], next_cursor


async def delete_artifact(
    db: Database, store: ArtifactStore, tenant_id: str, artifact_id: str
) -> None:
    async with db.write() as session:
        row = await _owned(session, tenant_id, artifact_id)
        blob_id = row.blob_id
        await session.delete(row)
        await session.flush()
        freed = await collect_blob(session, blob_id) if blob_id else None
    if freed is not None:
        await asyncio.to_thread(store.delete, freed)


async def collect_blob(session: AsyncSession, blob_id: str) -> str | None:
    """Delete the blob's row if no artifact refers to it; returns the storage key to delete.

    The blob row is locked first, so an upload reusing it either commits before this
    check (and is seen) or finds the row gone afterwards (and publishes its own copy).
    """
    blob = await session.scalar(select(BlobRow).where(BlobRow.id == blob_id).with_for_update())
    if blob is None:
        return None
    referenced = await session.scalar(select(exists().where(ArtifactRow.blob_id == blob_id)))
    if referenced:
        return None
    await session.execute(delete(BlobRow).where(BlobRow.id == blob_id))
    return blob.storage_key


@dataclass
class SweepReport:
    expired: int = 0
    tombstones: int = 0
    blobs_deleted: int = 0
    temporary_deleted: int = 0


async def sweep(db: Database, store: ArtifactStore, now: datetime, batch: int = 500) -> SweepReport:
    """Detach expired artifacts from their bytes, forget old tombstones, delete unused blobs."""
    report = SweepReport()
    async with db.write() as session:
        detached = await session.execute(
            update(ArtifactRow)
            .where(ArtifactRow.expires_at <= now, ArtifactRow.blob_id.is_not(None))
            .values(blob_id=None)
        )
        report.expired = detached.rowcount or 0  # type: ignore[attr-defined]
        forgotten = await session.execute(
            delete(ArtifactRow).where(
                ArtifactRow.expires_at <= now - timedelta(days=TOMBSTONE_DAYS)
            )
        )
        report.tombstones = forgotten.rowcount or 0  # type: ignore[attr-defined]
    async with db.read() as session:
        orphans = (
            await session.scalars(
                select(BlobRow.id)
                .where(~exists().where(ArtifactRow.blob_id == BlobRow.id))
                .limit(batch)
            )
        ).all()
    for blob_id in orphans:
        try:
            async with db.write() as session:
                key = await collect_blob(session, blob_id)
        except IntegrityError:
            continue  # referenced again meanwhile
        if key is not None:
            await asyncio.to_thread(store.delete, key)
            report.blobs_deleted += 1
    report.temporary_deleted = await asyncio.to_thread(store.sweep_temporary, 3600.0)
    return report
