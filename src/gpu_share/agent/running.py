"""Running a job's runtime in its sandbox, until it exits or something stops it.

The runtime reads `spec.json` in the job folder and writes `out/result.json`. While it
runs, its output goes to the job's log, the GPU memory its processes hold is sampled,
and training snapshots go out (`checkpoints`). The run ends when the process exits, or
is stopped — its process tree killed — at the job's timeout (`timeout_sec`, counted from
the lease), a cancel, a lost lease or a preemption, whichever comes first. A process
that went past one of its limits (`sandbox/limits.py`) says which in `RunEnd.limit_hit`.
"""

import asyncio
import contextlib
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from gpu_share.agent.cache import CachedFile
from gpu_share.agent.checkpoints import CheckpointKeeper
from gpu_share.agent.gpu import Gpu
from gpu_share.agent.jobcontext import JobContext
from gpu_share.agent.jobfiles import UnsafeJobFile, read_small
from gpu_share.agent.logstream import LogStream
from gpu_share.agent.runtimes.jobspec import RUNTIME_MODULES, JobSpec, RuntimeResult
from gpu_share.agent.sandbox import JobLimits, LimitHit, SandboxedProcess, SandboxSpec
from gpu_share.protocol import agent as wire

log = logging.getLogger(__name__)

RESULT_PATH = "out/result.json"
KILL_GRACE_SEC = 5.0


class Outcome:
    """What the coordinator said of the job while it runs (heartbeat answers, log
    verdicts); each one stops the run."""

    def __init__(self) -> None:
        self.canceled = asyncio.Event()
        self.dropped = asyncio.Event()
        self.preempted = asyncio.Event()  # spot work: on-demand work needs this slot


@dataclass(frozen=True)
class RunEnd:
    exit_code: int | None
    stopped: str | None  # "timeout", "canceled", "dropped", "preempted"; None: it exited
    limit_hit: LimitHit | None  # the limit that ended it


class SandboxedRun:
    def __init__(
        self,
        ctx: JobContext,
        lease: wire.LeasedJob,
        gpus: list[Gpu],
        *,
        job_dir: Path,
        logs: LogStream,
        outcome: Outcome,
        checkpoints: CheckpointKeeper | None,
    ) -> None:
        self.ctx = ctx
        self.lease = lease
        self.gpus = gpus
        self.job_dir = job_dir
        self.logs = logs
        self.outcome = outcome
        self.checkpoints = checkpoints
        self.peak_gpu_bytes: int | None = None

    @property
    def invoke_id(self) -> str:
        return self.lease.invoke_id

    def prepare(self, inputs: dict[str, CachedFile], options: dict[str, object]) -> SandboxSpec:
        """Write the runtime's `spec.json` into the job folder; returns how to run it."""
        lease = self.lease
        limits = (self.ctx.limits or JobLimits()).for_wall_time(lease.timeout_sec)
        self.logs.line(f"limits: {limits.describe()}")
        spec = JobSpec(
            runtime=lease.runtime,
            model="in/model",
            inputs="in/inputs" if lease.inputs is not None else None,
            outputs_dir="out",
            threads=self.ctx.threads,
            memory_limit_bytes=limits.memory_bytes,
            max_inputs_expanded_bytes=self.ctx.settings.max_inputs_expanded_bytes,
            options=options,
        )
        (self.job_dir / "spec.json").write_text(spec.model_dump_json())
        return SandboxSpec(
            argv=[sys.executable, "-m", RUNTIME_MODULES[lease.runtime], "spec.json"],
            job_dir=self.job_dir,
            inputs={name: cached.path for name, cached in inputs.items()},
            env={},
            gpu_uuids=[g.info.uuid for g in self.gpus],
            cpu_threads=self.ctx.threads,
            limits=limits,
        )

    async def run(self, spec: SandboxSpec, started: float) -> RunEnd:
        """Run until exit, timeout, cancel, drop or preemption."""
        process = await self._start_process(spec)
        pump = asyncio.create_task(self._pump(process))
        sampler = asyncio.create_task(self._sample_gpu_memory(process)) if self.gpus else None
        watcher = (
            asyncio.create_task(self.checkpoints.watch()) if self.checkpoints is not None else None
        )
        remaining = self.lease.timeout_sec - (time.monotonic() - started)
        waiters = {
            asyncio.create_task(process.wait()): None,
            asyncio.create_task(self.outcome.canceled.wait()): "canceled",
            asyncio.create_task(self.outcome.dropped.wait()): "dropped",
            asyncio.create_task(self.outcome.preempted.wait()): "preempted",
        }
        exit_code: int | None = None
        try:
            done, _ = await asyncio.wait(
                waiters, timeout=max(remaining, 0.0), return_when=asyncio.FIRST_COMPLETED
            )
            stopped: str | None = "timeout" if not done else None
            for task in done:
                stopped = stopped or waiters[task]
            if stopped is not None:
                process.kill()
            exit_code = await asyncio.wait_for(process.wait(), KILL_GRACE_SEC + 30)
        finally:
            if exit_code is None:  # cancelled (the agent is stopping) or stuck: kill it
                process.kill()
            for task in waiters:
                task.cancel()
            if sampler is not None:
                sampler.cancel()
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(pump, 5)
        return RunEnd(exit_code, stopped, process.limit_hit)

    def read_result(self) -> RuntimeResult | None:
        """result.json, read without following anything the job may have planted."""
        try:
            return RuntimeResult.model_validate_json(read_small(self.job_dir, RESULT_PATH))
        except (OSError, UnsafeJobFile, ValueError):
            return None

    async def _start_process(self, spec: SandboxSpec) -> SandboxedProcess:
        """In a warm sandbox if the pool has one that fits the job (its folder then takes the
        job folder's place), else in a sandbox started now."""
        if self.ctx.warm is not None and self.checkpoints is None:
            process = await self.ctx.warm.hand_over(self.lease.runtime, spec)
            if process is not None:
                log.info("invoke %s: runs in a warm sandbox", self.invoke_id)
                return process
        return await self.ctx.sandbox.start(spec)

    async def _pump(self, process: SandboxedProcess) -> None:
        while line := await process.stdout.readline():
            self.logs.write(line.decode(errors="replace"))

    async def _sample_gpu_memory(self, process: SandboxedProcess) -> None:
        while True:
            try:
                pids = {process.pid} | {
                    child.pid for child in psutil.Process(process.pid).children(recursive=True)
                }
            except psutil.Error:
                return
            used = await asyncio.to_thread(self.ctx.nvml.process_gpu_memory, self.gpus, pids)
            if used is not None:
                self.peak_gpu_bytes = max(self.peak_gpu_bytes or 0, used)
            await asyncio.sleep(0.5)
