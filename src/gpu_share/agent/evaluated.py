"""A spot check's other half (docs/trust.md): the outputs another node returned for the
same training, put in the job for the runtime to score (`runtimes/catboost_evaluation`).

Only the coordinator's checks carry them (`LeasedJob.evaluate`), inline or as a
platform artifact. What cannot be had (a failed download, a checksum that does not
match) leaves the runtime without the file, and the check says so rather than failing:
the trusted node's training is the tenant's result either way.
"""

import asyncio
import base64
import binascii
from pathlib import Path

import httpx

from gpu_share.agent.client import CoordinatorClient, CoordinatorError
from gpu_share.agent.logstream import LogStream
from gpu_share.protocol import agent as wire

EVALUATED_PATH = "in/evaluated.npz"


async def stage(
    client: CoordinatorClient,
    evaluate: wire.EvaluatedOutputs,
    job_dir: Path,
    logs: LogStream,
    *,
    max_bytes: int,
) -> str:
    """Write the outputs to score into the job; returns their job-relative path (the file
    is missing when they could not be had)."""
    dest = job_dir / EVALUATED_PATH
    dest.parent.mkdir(parents=True, exist_ok=True)
    if evaluate.inline_base64 is not None:
        try:
            data = base64.b64decode(evaluate.inline_base64, validate=True)
        except (binascii.Error, ValueError):
            logs.line("spot check: the outputs to score are not base64")
            return EVALUATED_PATH
        await asyncio.to_thread(dest.write_bytes, data)
    elif evaluate.artifact is not None:
        ref = evaluate.artifact
        try:
            sha, _ = await client.download(ref.url, dest, max_bytes=max_bytes, timeout=600.0)
        except (CoordinatorError, OSError, TimeoutError, httpx.HTTPError) as exc:
            logs.line(f"spot check: the outputs to score could not be fetched: {exc}")
            return EVALUATED_PATH
        if ref.sha256 is not None and sha != ref.sha256:
            dest.unlink(missing_ok=True)
            logs.line("spot check: the outputs to score do not match their checksum")
            return EVALUATED_PATH
    if dest.is_file():
        logs.line(f"spot check: scoring {dest.stat().st_size} bytes of another node's outputs")
    return EVALUATED_PATH
