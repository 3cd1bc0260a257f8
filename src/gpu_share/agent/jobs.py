"""Runs one leased job: fetch inputs, run the runtime in the sandbox, deliver outputs, report.

Whatever happens inside — a bad model, a crash, an OOM, a limit, a timeout, a cancel —
ends in a report with a precise error, never in an agent crash. If the coordinator
says the lease is stale, the job is stopped and nothing is reported.

Every job runs inside its limits (`job_limits()`: its slot's share of the machine
unless the provider says otherwise); one that goes past a limit fails with
RESOURCE_LIMIT and a message naming it, and the agent and other jobs carry on.
"""

import asyncio
import base64
import contextlib
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from gpu_share.agent.cache import ArtifactCache, CachedFile
from gpu_share.agent.checkpoints import SNAPSHOT_PATH, CheckpointKeeper
from gpu_share.agent.client import CoordinatorClient, CoordinatorError, StaleLease
from gpu_share.agent.failures import JobFailed
from gpu_share.agent.fetching import fetch
from gpu_share.agent.gpu import Gpu, Nvml
from gpu_share.agent.jobfiles import UnsafeJobFile, copy_out, read_small
from gpu_share.agent.logstream import LogStream
from gpu_share.agent.runtimes.jobspec import (
    RUNTIME_MODULES,
    JobSpec,
    RuntimeMetrics,
    RuntimeResult,
)
from gpu_share.agent.sandbox import (
    JobLimits,
    LimitedSandbox,
    LimitHit,
    Sandbox,
    SandboxedProcess,
    SandboxSpec,
)
from gpu_share.agent.sandbox.cgroups import agent_cgroups
from gpu_share.agent.settings import AgentSettings
from gpu_share.agent.warm import WarmPool
from gpu_share.hashing import sha256_file
from gpu_share.netguard import FetchError, SafeFetcher
from gpu_share.protocol import agent as wire
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.invokes import InvokeError, InvokeResult, InvokeStatus, Metrics

log = logging.getLogger(__name__)

RESULT_PATH = "out/result.json"
REPORT_RETRY_SEC = 3600.0  # keep trying to report through a coordinator outage
KILL_GRACE_SEC = 5.0


@dataclass
class JobContext:
    """What every job on this node shares.

    Made once, when the agent comes online and before any job or session starts: it
    clears what an earlier run of this agent left (`remove_leftovers`) and wraps the
    sandbox so that every process started through it — a job's, a session's model
    process — runs inside `limits`.
    """

    settings: AgentSettings
    client: CoordinatorClient
    cache: ArtifactCache
    fetcher: SafeFetcher
    sandbox: Sandbox
    nvml: Nvml
    threads: int  # per job: the node's cores shared among its slots
    slots: int  # jobs at once on this node
    limits: JobLimits | None = None  # None: the settings' share of the machine per slot
    warm: WarmPool | None = None  # sandboxes started ahead of their job (`warm.py`)

    def __post_init__(self) -> None:
        if self.limits is None:
            self.limits = job_limits(self.settings, self.slots)
        remove_leftovers(self.settings, self.sandbox)
        if not isinstance(self.sandbox, LimitedSandbox):
            self.sandbox = LimitedSandbox(self.sandbox, self.limits)


def job_limits(
    settings: AgentSettings,
    slots: int,
    *,
    total_memory: int | None = None,
    cores: int | None = None,
) -> JobLimits:
    """Each slot's share of the machine, where the provider has not set a limit itself."""
    if total_memory is None:
        total_memory = psutil.virtual_memory().total
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    memory = settings.job_memory_bytes or int(total_memory * settings.job_memory_fraction / slots)
    return JobLimits(
        memory_bytes=memory,
        cpus=settings.job_cpus or max(0.01, round(cores / slots, 2)),
        processes=settings.job_max_processes or None,
        open_files=settings.job_max_open_files or None,
        disk_bytes=settings.job_disk_bytes or None,
        cgroups=settings.job_cgroups,
    )


def remove_leftovers(settings: AgentSettings, sandbox: Sandbox) -> None:
    """Clear what an earlier run of this agent left when it was killed: job cgroups (with
    anything still in them), job containers, and job and session folders."""
    jobs_dir = settings.jobs_dir
    if not jobs_dir.is_dir():
        return
    cgroups = agent_cgroups(jobs_dir) if settings.job_cgroups else None
    if cgroups is not None and (removed := cgroups.remove_leftovers()):
        log.info("removed %d job cgroup(s) left by an earlier run", removed)
    remove = getattr(sandbox, "remove_leftovers", None)
    if remove is not None:
        remove(jobs_dir)
    if settings.keep_job_dirs:
        return
    leftovers = list(jobs_dir.iterdir())
    for path in leftovers:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    if leftovers:
        log.info("removed %d job folder(s) left by an earlier run", len(leftovers))


class Outcome:
    def __init__(self) -> None:
        self.canceled = asyncio.Event()
        self.dropped = asyncio.Event()
        self.preempted = asyncio.Event()  # spot work: on-demand work needs this slot


class Job:
    def __init__(
        self,
        ctx: JobContext,
        lease: wire.LeasedJob,
        gpus: list[Gpu],
        *,
        refusal: str | None = None,
        successor: Callable[[], wire.LeaseRequest | None] | None = None,
    ) -> None:
        """`refusal`: why this node cannot run the lease (it was given GPUs it does not have
        free); the job then fails with that message instead of running. `successor`: what
        to lease with the result for the slot this job leaves (None: lease nothing); the
        jobs leased so are in `successors` once `run` returns."""
        self.ctx = ctx
        self.lease = lease
        self.gpus = gpus
        self.refusal = refusal
        self.successor = successor
        self.successors: list[wire.LeasedJob] = []
        self.outcome = Outcome()
        self.dir = ctx.settings.jobs_dir / f"{lease.invoke_id}-{lease.attempt}"
        self.logs = LogStream(
            ctx.client,
            lease.invoke_id,
            lease.lease_token,
            flush_interval=ctx.settings.log_flush_interval_sec,
            canceled=self.outcome.canceled,
            dropped=self.outcome.dropped,
            preempted=self.outcome.preempted,
        )
        self.staging = ctx.settings.jobs_dir / f"{lease.invoke_id}-{lease.attempt}.staging"
        self.checkpoints: CheckpointKeeper | None = None
        self._pinned: list[str] = []
        self._peak_gpu_bytes: int | None = None
        self._stopped_for_preemption = False

    @property
    def invoke_id(self) -> str:
        return self.lease.invoke_id

    async def run(self) -> None:
        started = time.monotonic()
        if not self.lease.started:  # a coordinator that does not start jobs at the lease
            try:
                await self.ctx.client.start(self.invoke_id, self.lease.lease_token)
            except StaleLease:
                log.info("invoke %s: lease stale before start; dropping", self.invoke_id)
                return
        self.logs.start()
        report: wire.ResultReport | None
        try:
            report = await self._execute(started)
        except JobFailed as failure:
            self.logs.line(f"failed: {failure.message}")
            report = self._failed(failure.code, failure.message, started)
        except Exception as exc:
            log.exception("invoke %s: agent error", self.invoke_id)
            message = f"the agent hit an internal error: {type(exc).__name__}: {exc}"
            self.logs.line(message)
            report = self._failed(ErrorCode.AGENT_ERROR, message, started)
        finally:
            await self.logs.stop()
            for sha in self._pinned:
                self.ctx.cache.unpin(sha)
            await asyncio.to_thread(shutil.rmtree, self.staging, True)
            if not self.ctx.settings.keep_job_dirs:
                await asyncio.to_thread(shutil.rmtree, self.dir, True)
        if report is None or self._stopped_for_preemption:
            await self.logs.flush()
        else:  # the last lines travel with the result, and the slot's next lease
            report = report.model_copy(
                update={
                    "log": await self.logs.remainder(),
                    "next": self.successor() if self.successor is not None else None,
                }
            )
        if self._stopped_for_preemption and not self.outcome.dropped.is_set():
            try:  # the coordinator requeues it; its last checkpoint was uploaded above
                await self.ctx.client.report_preempted(
                    self.invoke_id, self.lease.lease_token, retry_for=REPORT_RETRY_SEC
                )
            except StaleLease:
                log.info("invoke %s: preemption not confirmed (lease stale)", self.invoke_id)
            return
        if report is None or self.outcome.dropped.is_set():
            log.info("invoke %s: lease lost; result not reported", self.invoke_id)
            return
        try:
            self.successors = await self.ctx.client.report(
                self.invoke_id, report, retry_for=REPORT_RETRY_SEC
            )
        except StaleLease:
            log.info("invoke %s: the coordinator refused the result (lease stale)", self.invoke_id)

    def _failed(self, code: str, message: str, started: float) -> wire.ResultReport:
        return self._ended(InvokeStatus.FAILED, InvokeError(code=code, message=message), started)

    def _ended(
        self,
        status: InvokeStatus,
        error: InvokeError,
        started: float,
        download_ms: int | None = None,
        runtime: RuntimeMetrics | None = None,
    ) -> wire.ResultReport:
        metrics = self._metrics(runtime, started, download_ms)
        return wire.ResultReport(
            lease_token=self.lease.lease_token,
            status=status,
            error=error,
            result=InvokeResult(metrics=metrics),
        )

    def _metrics(
        self, runtime: RuntimeMetrics | None, started: float, download_ms: int | None
    ) -> Metrics:
        """What ran, as the runtime saw it, with what only the agent measures added."""
        duration_ms = int((time.monotonic() - started) * 1000)
        if runtime is None:  # nothing ran: say where it would have
            device = "cuda" if self.lease.runtime.needs_gpu and self.gpus else "cpu"
            return Metrics(device=device, duration_ms=duration_ms, download_ms=download_ms)
        gpu_model = runtime.gpu_model or (
            self.gpus[0].info.model if self.gpus and runtime.device == "cuda" else None
        )
        return Metrics(
            device=runtime.device,
            execution_provider=runtime.execution_provider,
            gpu_model=gpu_model,
            duration_ms=duration_ms,
            compute_ms=runtime.compute_ms,
            download_ms=download_ms,
            peak_rss_bytes=runtime.peak_rss_bytes,
            peak_gpu_memory_bytes=self._peak_gpu_bytes,
            extra={**runtime.extra, "load_ms": runtime.load_ms},
        )

    async def _execute(self, started: float) -> wire.ResultReport | None:
        lease = self.lease
        if self.refusal is not None:
            raise JobFailed(ErrorCode.AGENT_ERROR, self.refusal)
        (self.dir / "in").mkdir(parents=True, exist_ok=True)
        (self.dir / "out").mkdir(exist_ok=True)
        self.staging.mkdir(mode=0o700, exist_ok=True)
        self.logs.line(
            f"invoke {self.invoke_id} attempt {lease.attempt}: {lease.runtime.value} "
            f"in the {self.ctx.sandbox.name} sandbox"
            + (f" on {', '.join(g.info.model for g in self.gpus)}" if self.gpus else "")
        )
        fetch_started = time.monotonic()
        inputs = {"model": await self._fetch("model", lease.model)}
        if lease.inputs is not None:
            inputs["inputs"] = await self._fetch("inputs", lease.inputs)
        download_ms = int((time.monotonic() - fetch_started) * 1000)

        options: dict[str, object] = {}
        if lease.runtime.kind == "train":
            (self.dir / "checkpoint").mkdir(exist_ok=True)
            self.checkpoints = CheckpointKeeper(
                self.ctx.client,
                lease,
                self.dir,
                self.staging,
                self.logs,
                interval_sec=self.ctx.settings.checkpoint_interval_sec,
                max_bytes=self.ctx.settings.max_download_bytes,
            )
            options = {
                "snapshot_path": SNAPSHOT_PATH,
                "snapshot_interval_sec": max(1, round(self.ctx.settings.checkpoint_interval_sec)),
            }
            if (restored := await self.checkpoints.restore()) is not None:
                options["resume_from"] = restored
        limits = (self.ctx.limits or JobLimits()).for_wall_time(lease.timeout_sec)
        self.logs.line(f"limits: {limits.describe()}")
        spec = JobSpec(
            runtime=lease.runtime,
            model="in/model",
            inputs="in/inputs" if lease.inputs is not None else None,
            outputs_dir="out",
            threads=self.ctx.threads,
            memory_limit_bytes=limits.memory_bytes,
            options=options,
        )
        (self.dir / "spec.json").write_text(spec.model_dump_json())
        exit_code, stopped, limit_hit = await self._run_sandboxed(
            SandboxSpec(
                argv=[sys.executable, "-m", RUNTIME_MODULES[lease.runtime], "spec.json"],
                job_dir=self.dir,
                inputs={name: cached.path for name, cached in inputs.items()},
                env={},
                gpu_uuids=[g.info.uuid for g in self.gpus],
                cpu_threads=self.ctx.threads,
                limits=limits,
            ),
            started,
        )
        if stopped == "dropped":
            return None
        if stopped == "preempted":
            if exit_code != 0 or self._read_result() is None:
                self.logs.line(
                    "preempted: on-demand work needs this slot; the job was stopped"
                    + (" (its last checkpoint is kept)" if self.checkpoints else "")
                    + " and will be requeued"
                )
                self._stopped_for_preemption = True
                return None
            stopped = None  # it finished before the preemption came: the result wins
        if stopped in ("timeout", "canceled"):
            message = (
                f"the job ran longer than timeout_sec={lease.timeout_sec} and was killed"
                if stopped == "timeout"
                else "canceled by the tenant; the job was stopped"
            )
            self.logs.line(message)
            status = InvokeStatus.TIMEOUT if stopped == "timeout" else InvokeStatus.CANCELED
            code = ErrorCode.TIMEOUT if stopped == "timeout" else ErrorCode.CANCELED
            return self._ended(
                status, InvokeError(code=code, message=message), started, download_ms
            )
        result = self._read_result()
        if limit_hit is not None and (result is None or not result.ok or limit_hit.limit == "disk"):
            self.logs.line(f"stopped at a limit: {limit_hit.message}")
            return self._ended(
                InvokeStatus.FAILED,
                InvokeError(code=ErrorCode.RESOURCE_LIMIT, message=limit_hit.message),
                started,
                download_ms,
                runtime=result.metrics if result is not None else None,
            )
        if result is None:
            raise JobFailed(
                ErrorCode.OUT_OF_MEMORY if exit_code in (-9, 137) else ErrorCode.RUNTIME_ERROR,
                f"the runtime exited with code {exit_code} without a result"
                + (" (killed: probably out of memory)" if exit_code in (-9, 137) else "")
                + "; see the log",
            )
        if not result.ok:
            assert result.error is not None
            self.logs.line(f"runtime error {result.error.code}: {result.error.message}")
            failure = InvokeError(code=result.error.code, message=result.error.message)
            return self._ended(
                InvokeStatus.FAILED, failure, started, download_ms, runtime=result.metrics
            )
        metrics = self._metrics(result.metrics, started, download_ms)
        assert result.outputs is not None
        outputs_path = self.staging / "outputs"
        try:
            await asyncio.to_thread(copy_out, self.dir, result.outputs, outputs_path)
        except (OSError, UnsafeJobFile) as exc:
            raise JobFailed(
                ErrorCode.RUNTIME_ERROR, f"the runtime's outputs could not be read: {exc}"
            ) from exc
        delivered, error = await self._deliver(
            outputs_path, result.outputs_format or "npz", metrics
        )
        return wire.ResultReport(
            lease_token=lease.lease_token,
            status=InvokeStatus.FAILED if error else InvokeStatus.DONE,
            result=delivered,
            error=error,
        )

    def _read_result(self) -> RuntimeResult | None:
        """result.json, read without following anything the job may have planted."""
        try:
            return RuntimeResult.model_validate_json(read_small(self.dir, RESULT_PATH))
        except (OSError, UnsafeJobFile, ValueError):
            return None

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

    async def _run_sandboxed(
        self, spec: SandboxSpec, started: float
    ) -> tuple[int | None, str | None, LimitHit | None]:
        """Run until exit, timeout, cancel or drop; returns (exit code, why it was stopped,
        the limit that ended it)."""
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
        return exit_code, stopped, process.limit_hit

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
        import psutil

        while True:
            try:
                pids = {process.pid} | {
                    child.pid for child in psutil.Process(process.pid).children(recursive=True)
                }
            except psutil.Error:
                return
            used = await asyncio.to_thread(self.ctx.nvml.process_gpu_memory, self.gpus, pids)
            if used is not None:
                self._peak_gpu_bytes = max(self._peak_gpu_bytes or 0, used)
            await asyncio.sleep(0.5)

    async def _deliver(
        self, path: Path, fmt: str, metrics: Metrics
    ) -> tuple[InvokeResult, InvokeError | None]:
        """Inline, the tenant's presigned URL, or platform storage — in that order of fit."""
        size, sha = await asyncio.to_thread(lambda: (path.stat().st_size, sha256_file(path)))

        def result(**where: str) -> InvokeResult:
            return InvokeResult(
                outputs_format=fmt, outputs_size=size, outputs_sha256=sha, metrics=metrics, **where
            )

        upload = self.lease.outputs_upload
        if upload is not None:
            try:
                status = await self.ctx.fetcher.upload(
                    upload.url,
                    path,
                    method=upload.method,
                    headers=upload.headers,
                    timeout=self.ctx.settings.download_timeout_sec,
                )
                self.logs.line(f"outputs: {size} bytes uploaded to outputs_upload (HTTP {status})")
                return result(outputs_url=upload.url), None
            except FetchError as exc:
                message = f"outputs_upload failed: {exc.message}"
                self.logs.line(message)
                try:
                    stored = await self._store_outputs(path, sha, size)
                except JobFailed as failure:
                    error = InvokeError(code=failure.code, message=f"{message}; {failure.message}")
                    return InvokeResult(metrics=metrics), error
                message += "; the outputs were kept in platform storage"
                error = InvokeError(code=ErrorCode.OUTPUT_UPLOAD_FAILED, message=message)
                return result(outputs_url=stored.url), error
        if size <= self.lease.inline_limit_bytes:
            data = await asyncio.to_thread(path.read_bytes)
            self.logs.line(f"outputs: {size} bytes inline")
            return result(outputs_inline_base64=base64.b64encode(data).decode()), None
        try:
            stored = await self._store_outputs(path, sha, size)
        except JobFailed as failure:
            return InvokeResult(metrics=metrics), InvokeError(
                code=failure.code, message=failure.message
            )
        self.logs.line(f"outputs: {size} bytes stored as {stored.artifact_id}")
        return result(outputs_url=stored.url), None

    async def _store_outputs(self, path: Path, sha: str, size: int) -> wire.OutputsStored:
        """Raises JobFailed(QUOTA_EXCEEDED) when the tenant's storage has no room for them."""
        try:
            return await self.ctx.client.store_outputs(
                self.invoke_id, self.lease.lease_token, path, sha
            )
        except CoordinatorError as exc:
            if exc.status != 413 or exc.code != ErrorCode.QUOTA_EXCEEDED:
                raise
            message = (
                f"the outputs ({size} bytes) could not be stored: your artifact storage is "
                f"full ({exc.message}); delete old artifacts (outputs of earlier invokes: "
                "DELETE /v1/artifacts/{id}) and invoke again"
            )
            self.logs.line(message)
            raise JobFailed(ErrorCode.QUOTA_EXCEEDED, message) from exc
