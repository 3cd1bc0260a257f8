"""The references an agent fetches a job's files by: the tenant's own URL as given, or a
platform artifact behind a short-lived signed link (SPEC §4.1). A lease's model, inputs
and checkpoint are made here (`leased_jobs`), and so is a session's model (`sessions`).

The link is the store's own presigned GET where the store makes one (S3), so artifact
bytes never pass through the coordinator; else this coordinator's download URL with a
token it signed.
"""

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.orm import ArtifactRow, BlobRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.core.signing import UrlSigner
from gpu_share.coordinator.services.artifacts.artifacts import artifact_url
from gpu_share.coordinator.storage import ArtifactStore
from gpu_share.protocol import agent as wire


@dataclass(frozen=True)
class LeaseContext:
    """What a lease is made with besides the database: the settings (its deadline, its
    price, who takes spot checks), and the store, signer and public URL its links are
    made with."""

    settings: Settings
    store: ArtifactStore
    signer: UrlSigner
    base_url: str


async def artifact_ref(
    session: AsyncSession,
    url: str,
    artifact_id: str | None,
    sha256: str | None,
    now: datetime,
    ctx: LeaseContext,
    loaded: Mapping[str, ArtifactRow] | None = None,
) -> wire.ArtifactRef | None:
    """A fetchable reference; None when the platform artifact has expired since submission.
    `loaded`: artifacts already read, by id."""
    if artifact_id is None:
        return wire.ArtifactRef(url=url, platform=False, sha256=sha256, size=None)
    artifact = (loaded or {}).get(artifact_id) or await session.get(ArtifactRow, artifact_id)
    if artifact is None or artifact.blob_id is None or artifact.expires_at <= now:
        return None
    lifetime = timedelta(seconds=ctx.settings.artifact_token_ttl_sec)
    link: str | None = None
    if ctx.store.presigns:
        blob = await session.get(BlobRow, artifact.blob_id)
        if blob is None:
            return None
        link = await asyncio.to_thread(ctx.store.download_url, blob.storage_key, lifetime)
    if link is None:
        token = ctx.signer.sign(artifact_id, now + lifetime)
        link = f"{artifact_url(ctx.base_url, artifact_id)}?token={token}"
    # platform=True vouches for this sha256 (the stored artifact's own, and the caller
    # resolved an artifact the tenant owns): agents serve it from their cache.
    return wire.ArtifactRef(
        url=link,
        platform=True,
        sha256=artifact.sha256,
        size=artifact.size,
    )


class UsesArtifacts(Protocol):
    """An invoke as far as its files go: an `InvokeRow`, or the claim's driver row."""

    @property
    def model_artifact_id(self) -> str | None: ...
    @property
    def inputs_artifact_id(self) -> str | None: ...
    @property
    def checkpoint_artifact_id(self) -> str | None: ...


async def load_artifacts(
    session: AsyncSession, rows: Sequence[UsesArtifacts]
) -> dict[str, ArtifactRow]:
    """The artifacts these invokes use, read in one statement rather than one each."""
    ids = {
        artifact_id
        for row in rows
        for artifact_id in (
            row.model_artifact_id,
            row.inputs_artifact_id,
            row.checkpoint_artifact_id,
        )
        if artifact_id
    }
    if not ids:
        return {}
    query = select(ArtifactRow).where(ArtifactRow.id.in_(sorted(ids)))
    return {artifact.id: artifact for artifact in (await session.scalars(query)).all()}
