"""Training snapshots: restore the newest one into a requeued job, ship new ones out.

The runtime writes its snapshot at `SNAPSHOT_PATH` inside the job folder at an
interval. While the job runs, the agent copies each new version out (safely: see
`jobfiles`) and uploads it; the coordinator hands the newest to the next attempt if
this one is lost, which then resumes instead of starting over.
"""

import asyncio
import contextlib
import logging
from pathlib import Path

from gpu_share.agent.client import CoordinatorClient, CoordinatorError, StaleLease
from gpu_share.agent.jobfiles import copy_out, stat_inside
from gpu_share.agent.logstream import LogStream
from gpu_share.hashing import sha256_file
from gpu_share.protocol import agent as wire
from gpu_share.protocol.errors import ErrorCode

log = logging.getLogger(__name__)

SNAPSHOT_PATH = "checkpoint/snapshot.cbs"
RESTORED_PATH = "in/checkpoint"


class CheckpointKeeper:
    def __init__(
        self,
        client: CoordinatorClient,
        lease: wire.LeasedJob,
        job_dir: Path,
        staging: Path,
        logs: LogStream,
        *,
        interval_sec: float,
        max_bytes: int,
    ) -> None:
        self._client = client
        self._lease = lease
        self._job_dir = job_dir
        self._staging = staging
        self._logs = logs
        self.interval_sec = interval_sec
        self._max_bytes = max_bytes
        self._last: tuple[float, int] | None = None
        self._refused = False  # the tenant's storage was full: said once in the job's log
        self.uploaded = 0

    async def prepare(self) -> dict[str, object]:
        """Make the job's snapshot folder and restore the lease's checkpoint into the job;
        the runtime's options: where and how often to write snapshots, what to resume from."""
        (self._job_dir / SNAPSHOT_PATH).parent.mkdir(exist_ok=True)
        options: dict[str, object] = {
            "snapshot_path": SNAPSHOT_PATH,
            "snapshot_interval_sec": max(1, round(self.interval_sec)),
        }
        if (restored := await self.restore()) is not None:
            options["resume_from"] = restored
        return options

    async def restore(self) -> str | None:
        """Download the lease's checkpoint into the job; returns its job-relative path."""
        ref = self._lease.checkpoint
        if ref is None:
            return None
        dest = self._job_dir / RESTORED_PATH
        sha, size = await self._client.download(
            ref.url, dest, max_bytes=self._max_bytes, timeout=600.0
        )
        if ref.sha256 is not None and sha != ref.sha256:
            dest.unlink(missing_ok=True)
            self._logs.line("checkpoint: checksum mismatch; starting from scratch")
            return None
        self._logs.line(f"checkpoint: resuming from a {size}-byte snapshot of an earlier attempt")
        return RESTORED_PATH

    async def watch(self) -> None:
        """Upload every new snapshot until cancelled (then once more, if one is new)."""
        try:
            while True:
                await asyncio.sleep(self.interval_sec)
                await self.upload_if_new()
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.upload_if_new())
            raise

    async def upload_if_new(self) -> None:
        found = await asyncio.to_thread(stat_inside, self._job_dir, SNAPSHOT_PATH)
        if found is None or found.st_size == 0 or found.st_size > self._max_bytes:
            return
        version = (found.st_mtime, found.st_size)
        if version == self._last:
            return
        copy = self._staging / "snapshot.upload"
        try:
            size = await asyncio.to_thread(copy_out, self._job_dir, SNAPSHOT_PATH, copy)
            sha = await asyncio.to_thread(sha256_file, copy)
            await self._client.store_checkpoint(
                self._lease.invoke_id, self._lease.lease_token, copy, sha
            )
        except StaleLease:
            return
        except CoordinatorError as exc:
            if exc.status == 422 and exc.code == ErrorCode.VALIDATION_ERROR:
                self._last = version  # the same bytes would be refused again
                self._logs.line(f"checkpoint: a snapshot was refused: {exc.message}")
            elif exc.status != 413 or exc.code != ErrorCode.QUOTA_EXCEEDED:
                log.warning("invoke %s: checkpoint upload failed: %s", self._lease.invoke_id, exc)
            elif not self._refused:
                self._refused = True
                self._logs.line(
                    f"checkpoint: a {found.st_size}-byte snapshot was not saved, your artifact "
                    f"storage is full ({exc.message}); training carries on without it (a "
                    "requeued attempt resumes from the last snapshot saved, if any); delete "
                    "old artifacts to make room"
                )
            return
        except Exception as exc:  # a snapshot is an optimisation: never fail the job over it
            log.warning("invoke %s: checkpoint upload failed: %s", self._lease.invoke_id, exc)
            return
        finally:
            copy.unlink(missing_ok=True)
        self._last = version
        self._refused = False
        self.uploaded += 1
        self._logs.line(f"checkpoint: saved a {size}-byte snapshot")
