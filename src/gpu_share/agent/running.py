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
from gpu_share.agent.runtimes.runner import RESULT_WRITTEN_LINE
from gpu_share.agent.sandbox import JobLimits, LimitHit, SandboxedProcess, SandboxSpec
from gpu_share.agent.sandbox.process import SubprocessJob
from gpu_share.protocol import agent as wire

log = logging.getLogger(__name__)

RESULT_PATH = "out/result.json"
KILL_GRACE_SEC = 5.0
EXIT_AFTER_RESULT_SEC = 2.0
"""How long a runtime that said its verdict is written may take to exit before it is killed."""
_WRITTEN = RESULT_WRITTEN_LINE.encode()


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
        self._exiting: asyncio.Task[None] | None = None
        self._verdict: RuntimeResult | None = None  # the success the run ended at (`run`)

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
        """Run until exit, timeout, cancel, drop or preemption.

        A runtime's last line says its verdict and outputs are written and closed
        (`RESULT_WRITTEN_LINE`): the run ends there, and what is left of the process tree
        (its exit, ~5 ms: the kernel unmapping the runtime, then bwrap's and the
        supervisor's exits) is waited for, or killed after `EXIT_AFTER_RESULT_SEC`, while
        the result is on its way (`finished`), and before the job's folder goes. Only a
        success ends so (a failure waits for the exit, whose limits may say why), on a
        sandbox that can judge the folder's disk use before the exit. A job that printed
        the line early is judged by what it had written by then, and ended
        `EXIT_AFTER_RESULT_SEC` later."""
        process = await self._start_process(spec)
        written = asyncio.Event()
        pump = asyncio.create_task(self._pump(process, written))
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
        said = asyncio.create_task(written.wait())
        if isinstance(process, SubprocessJob):  # it can judge its folder before its exit
            waiters[said] = None
        exit_code: int | None = None
        limit_hit: LimitHit | None = None
        try:
            done, _ = await asyncio.wait(
                waiters, timeout=max(remaining, 0.0), return_when=asyncio.FIRST_COMPLETED
            )
            succeeded = said in done and self._succeeded(process, written)
            if done == {said} and not succeeded:
                # A failure: the exit is awaited as any run's, within what is left of its time.
                del waiters[said]
                remaining = self.lease.timeout_sec - (time.monotonic() - started)
                done, _ = await asyncio.wait(
                    waiters, timeout=max(remaining, 0.0), return_when=asyncio.FIRST_COMPLETED
                )
            stopped: str | None = "timeout" if not done else None
            for task in done:
                stopped = stopped or waiters[task]
            if stopped is None and succeeded:
                assert isinstance(process, SubprocessJob)
                exit_code = 0
                limit_hit = process.limit_hit or await asyncio.to_thread(process.disk_exceeded)
                self._exiting = asyncio.create_task(self._reap(process, pump))
            else:
                if stopped is not None:
                    process.kill()
                exit_code = await asyncio.wait_for(process.wait(), KILL_GRACE_SEC + 30)
                limit_hit = process.limit_hit
        finally:
            if exit_code is None:  # cancelled (the agent is stopping) or stuck: kill it
                process.kill()
            for task in [*waiters, said]:
                task.cancel()
            if sampler is not None:
                sampler.cancel()
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            if self._exiting is None:
                with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                    await asyncio.wait_for(pump, 5)
        return RunEnd(exit_code, stopped, limit_hit)

    def _succeeded(self, process: SandboxedProcess, written: asyncio.Event) -> bool:
        """Whether the runtime said it wrote a verdict, and that verdict is a success: a
        failure waits for the exit, whose limits may say more of why it failed."""
        if not written.is_set() or not isinstance(process, SubprocessJob):
            return False
        result = self.read_result()
        if result is None or not result.ok:
            return False
        self._verdict = result  # what the report says: read once
        return True

    async def finished(self) -> None:
        """Once nothing of the job's processes is left (a run that ended at its result's
        line still had its exit to come; `run`)."""
        if self._exiting is not None:
            await self._exiting

    @staticmethod
    async def _reap(process: SubprocessJob, pump: asyncio.Task[None]) -> None:
        """Its exit, or its end: killing it at once would cost the report its tree's walk
        (`kill`), and a runtime exits within milliseconds of its word. Killed all the same
        if the agent stops meanwhile."""
        try:
            try:
                await asyncio.wait_for(process.wait(), EXIT_AFTER_RESULT_SEC)
            except TimeoutError:
                process.kill()
                await asyncio.wait_for(process.wait(), KILL_GRACE_SEC + 30)
        except TimeoutError:
            pass  # its supervisor did not end it: what is left is the agent's to sweep
        finally:
            if not process.exited:
                process.kill()
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(pump, 5)

    def read_result(self) -> RuntimeResult | None:
        """result.json, read without following anything the job may have planted (once,
        for a run that ended at its success's line)."""
        if self._verdict is not None:
            return self._verdict
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

    async def _pump(self, process: SandboxedProcess, written: asyncio.Event) -> None:
        while line := await process.stdout.readline():
            if line.rstrip(b"\r\n") == _WRITTEN:
                written.set()  # the runtime's word to the agent, not a line of the job's log
                continue
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
