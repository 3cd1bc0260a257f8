"""Staging a job: its folders made, its model and inputs fetched into place, and all of it
removed when the job ends.

A job has two folders side by side in the jobs folder. Its own (`<invoke>-<attempt>`:
`in/`, `out/`, `spec.json`, `checkpoint/` when it trains) is what the sandbox sees. The
agent's private one beside it (`….staging`, mode 0700) holds what is copied out of the
job's reach before the agent reads it: the outputs, a snapshot on its way out. The
model and inputs are not copied in: they are fetched into the cache (`fetching`),
pinned there until the job ends, and handed to the sandbox by path.
"""

import asyncio
import shutil
import time

from gpu_share.agent.cache import CachedFile
from gpu_share.agent.fetching import fetch
from gpu_share.agent.jobcontext import JobContext
from gpu_share.agent.logstream import LogStream
from gpu_share.protocol import agent as wire


class JobStaging:
    def __init__(self, ctx: JobContext, lease: wire.LeasedJob, logs: LogStream) -> None:
        self.ctx = ctx
        self.lease = lease
        self.logs = logs
        self.job_dir = ctx.settings.jobs_dir / f"{lease.invoke_id}-{lease.attempt}"
        self.staging_dir = ctx.settings.jobs_dir / f"{lease.invoke_id}-{lease.attempt}.staging"
        self._pinned: list[str] = []

    def make_folders(self) -> None:
        (self.job_dir / "in").mkdir(parents=True, exist_ok=True)
        (self.job_dir / "out").mkdir(exist_ok=True)
        self.staging_dir.mkdir(mode=0o700, exist_ok=True)

    async def fetch_inputs(self) -> tuple[dict[str, CachedFile], int]:
        """The lease's model and inputs by name, and how many milliseconds fetching took."""
        started = time.monotonic()
        inputs = {"model": await self._fetch("model", self.lease.model)}
        if self.lease.inputs is not None:
            inputs["inputs"] = await self._fetch("inputs", self.lease.inputs)
        return inputs, int((time.monotonic() - started) * 1000)

    async def _fetch(self, name: str, ref: wire.ArtifactRef) -> CachedFile:
        cached = await fetch(
            ref,
            f"{name}_url",
            settings=self.ctx.settings,
            cache=self.ctx.cache,
            client=self.ctx.client,
            fetcher=self.ctx.fetcher,
        )
        self._pinned.append(cached.sha256)
        how = "downloaded" if cached.downloaded else "from cache"
        self.logs.line(f"{name}: {cached.size} bytes, sha256 {cached.sha256[:16]}…, {how}")
        return cached

    async def remove(self) -> None:
        """Unpin the inputs and remove both folders (the job's own is kept when the
        provider keeps job folders)."""
        for sha in self._pinned:
            self.ctx.cache.unpin(sha)
        await asyncio.to_thread(shutil.rmtree, self.staging_dir, True)
        if not self.ctx.settings.keep_job_dirs:
            await asyncio.to_thread(shutil.rmtree, self.job_dir, True)
