"""Artifact bytes over HTTP, for the API and the console alike: what an upload may be and
declares, and a download answered from storage without holding the file in memory."""

import asyncio
from collections.abc import AsyncIterator
from enum import StrEnum

from fastapi import Request, Response
from fastapi.responses import FileResponse, StreamingResponse
from starlette.concurrency import iterate_in_threadpool

from gpu_share.coordinator.core.errors import field_error
from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.artifacts import artifacts


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


async def stream_download(replica: Replica, download: artifacts.Download) -> Response:
    headers = {
        "ETag": f'"{download.artifact.sha256}"',
        "X-Content-SHA256": download.artifact.sha256,
        "Cache-Control": "private, max-age=0",
    }
    path = replica.store.local_path(download.storage_key)
    if path is not None and await asyncio.to_thread(path.is_file):
        return FileResponse(path, media_type="application/octet-stream", headers=headers)
    chunks: AsyncIterator[bytes] = iterate_in_threadpool(replica.store.read(download.storage_key))
    headers["Content-Length"] = str(download.artifact.size)
    return StreamingResponse(chunks, media_type="application/octet-stream", headers=headers)
