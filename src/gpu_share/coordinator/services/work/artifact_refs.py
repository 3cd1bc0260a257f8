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

from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.db import driver_of
from gpu_share.coordinator.core.driver_sql import Sql
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


@dataclass(frozen=True, slots=True)
class StoredArtifact:
    """What a link to a platform artifact is made from (`load_artifacts`)."""

    id: str
    tenant_id: str
    sha256: str
    size: int
    expires_at: datetime
    storage_key: str | None  # its blob's; None: the artifact holds no bytes (any more)


async def artifact_ref(
    session: AsyncSession,
    url: str,
    artifact_id: str | None,
    sha256: str | None,
    now: datetime,
    ctx: LeaseContext,
    loaded: Mapping[str, StoredArtifact] | None = None,
) -> wire.ArtifactRef | None:
    """A fetchable reference; None when the platform artifact has expired since submission.
    `loaded`: artifacts already read, by id (`load_artifacts`)."""
    if artifact_id is None:
        return wire.ArtifactRef(url=url, platform=False, sha256=sha256, size=None)
    artifact = (loaded or {}).get(artifact_id) or await stored_artifact(session, artifact_id)
    if artifact is None or artifact.storage_key is None or artifact.expires_at <= now:
        return None
    lifetime = timedelta(seconds=ctx.settings.artifact_token_ttl_sec)
    link: str | None = None
    if ctx.store.presigns:
        link = await asyncio.to_thread(ctx.store.download_url, artifact.storage_key, lifetime)
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
) -> dict[str, StoredArtifact]:
    """The artifacts these invokes use, read in one statement rather than one each."""
    return await stored_artifacts(
        session,
        {
            artifact_id
            for row in rows
            for artifact_id in (
                row.model_artifact_id,
                row.inputs_artifact_id,
                row.checkpoint_artifact_id,
            )
            if artifact_id
        },
    )


_STORED_COLUMNS = (
    "SELECT artifacts.id, artifacts.tenant_id, artifacts.sha256, artifacts.size,"
    " artifacts.expires_at, blobs.storage_key"
    " FROM artifacts LEFT JOIN blobs ON blobs.id = artifacts.blob_id"
)
_STORED = {
    "postgresql": Sql(
        f"{_STORED_COLUMNS} WHERE artifacts.id = ANY(:ids)",
        datetimes=("expires_at",),
    ),
    "sqlite": Sql(
        f"{_STORED_COLUMNS} WHERE artifacts.id IN (SELECT value FROM json_each(:ids))",  # noqa: S608
        datetimes=("expires_at",),
        jsons=("ids",),
    ),
}
"""Artifacts with their blobs' storage keys, in one round trip on the driver: every submit
and every lease of a job that uses platform artifacts reads them."""


async def stored_artifact(session: AsyncSession, artifact_id: str) -> StoredArtifact | None:
    """One artifact, whoever's it is: the caller checks that it is the tenant's."""
    return (await stored_artifacts(session, {artifact_id})).get(artifact_id)


async def stored_artifacts(session: AsyncSession, ids: set[str]) -> dict[str, StoredArtifact]:
    """These artifacts, by id (those that exist), in the session's transaction."""
    if not ids:
        return {}
    tx = await driver_of(session)
    rows = await tx.fetch(_STORED[tx.dialect], ids=sorted(ids))
    return {
        row["id"]: StoredArtifact(
            id=row["id"],
            tenant_id=row["tenant_id"],
            sha256=row["sha256"],
            size=row["size"],
            expires_at=row["expires_at"],
            storage_key=row["storage_key"],
        )
        for row in rows
    }
