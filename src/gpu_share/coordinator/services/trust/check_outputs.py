"""The outputs of a result, as arrays, for a spot check to compare: inline, or the tenant's
outputs artifact its URL names. They may come from a hostile node, so they are read
with the shared NPZ reader (`gpu_share.npz_reading`), bounded by
`spot_check_max_output_bytes`, and an artifact counts only if it is the invoke's
tenant's. Where they are is found in a transaction (`locate`); the bytes are read after
it, off the event loop (`read`)."""

import asyncio
import base64
import binascii
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator.core.errors import ApiError
from gpu_share.coordinator.core.orm import ArtifactRow, InvokeRow
from gpu_share.coordinator.services.artifacts import artifacts
from gpu_share.coordinator.services.work.invokes import outputs_artifact_id
from gpu_share.coordinator.storage import ArtifactStore
from gpu_share.npz_reading import Array, NpzError, NpzTooLarge, load_npz_bytes


@dataclass(frozen=True)
class StoredOutputs:
    inline: bytes | None = None
    storage_key: str | None = None
    size: int | None = None
    artifact_id: str | None = None
    problem: str | None = None  # why there is nothing to read


class OutputsTooLarge(Exception):
    """Outputs past the comparison's limit: nothing is concluded from them."""


async def locate(session: AsyncSession, row: InvokeRow, now: datetime) -> StoredOutputs:
    result = row.result or {}
    inline = result.get("outputs_inline_base64")
    if isinstance(inline, str) and inline:
        try:
            return StoredOutputs(inline=base64.b64decode(inline, validate=True))
        except (binascii.Error, ValueError):
            return StoredOutputs(problem="its inline outputs are not base64")
    artifact_id = outputs_artifact_id(result)
    if artifact_id is None:
        return StoredOutputs(problem="it returned no outputs the platform holds")
    row_of = await session.get(ArtifactRow, artifact_id)
    if row_of is None or row_of.tenant_id != row.tenant_id:
        return StoredOutputs(problem=f"its outputs name artifact {artifact_id}, not its tenant's")
    try:
        download = await artifacts.open_signed_download(session, artifact_id, now)
    except ApiError as exc:
        return StoredOutputs(artifact_id=artifact_id, problem=f"its outputs are gone: {exc}")
    return StoredOutputs(
        storage_key=download.storage_key, size=row_of.size, artifact_id=artifact_id
    )


def _read(stored: StoredOutputs, store: ArtifactStore, max_bytes: int) -> dict[str, Array] | str:
    if stored.problem is not None:
        return stored.problem
    if stored.inline is not None:
        data = stored.inline
    else:
        assert stored.storage_key is not None
        if stored.size is not None and stored.size > max_bytes:
            raise OutputsTooLarge(f"{stored.size} bytes stored")
        data = b"".join(store.read(stored.storage_key))
    try:
        return load_npz_bytes(data, max_bytes=max_bytes)
    except NpzTooLarge as exc:
        raise OutputsTooLarge(str(exc)) from exc
    except NpzError as exc:
        return str(exc)


async def read(
    stored: StoredOutputs, store: ArtifactStore, max_bytes: int
) -> dict[str, Array] | str:
    """The arrays, or why they cannot be read (a bad archive: evidence against whoever
    sent it). Raises `OutputsTooLarge`."""
    return await asyncio.to_thread(_read, stored, store, max_bytes)
