"""Runs one leased job: stage its inputs, run the runtime in the sandbox, report.

The steps live in their own modules — `staging` (folders, inputs), `running` (the
sandboxed process until it ends), `reporting` (metrics, outputs, the report) — and this
one decides what each ending means. Whatever happens inside — a bad model, a crash, an
OOM, a limit, a timeout, a cancel — ends in a report with a precise error, never in an
agent crash; a job that goes past a limit fails with RESOURCE_LIMIT and a message naming
it. If the coordinator says the lease is stale, the job is stopped and nothing is
reported.
"""

import asyncio
import logging
import time
from collections.abc import Callable

from gpu_share.agent import evaluated
from gpu_share.agent.checkpoints import CheckpointKeeper
from gpu_share.agent.client import StaleLease
from gpu_share.agent.failures import JobFailed
from gpu_share.agent.gpu import Gpu
from gpu_share.agent.jobcontext import JobContext
from gpu_share.agent.jobfiles import UnsafeJobFile, copy_out
from gpu_share.agent.logstream import LogStream
from gpu_share.agent.reporting import JobReporter
from gpu_share.agent.running import Outcome, RunEnd, SandboxedRun
from gpu_share.agent.staging import JobStaging
from gpu_share.protocol import agent as wire
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.invokes import InvokeError, InvokeStatus

log = logging.getLogger(__name__)


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
        self.logs = LogStream(
            ctx.client,
            lease.invoke_id,
            lease.lease_token,
            flush_interval=ctx.settings.log_flush_interval_sec,
            canceled=self.outcome.canceled,
            dropped=self.outcome.dropped,
            preempted=self.outcome.preempted,
        )
        self.staging = JobStaging(ctx, lease, self.logs)
        self.reporter = JobReporter(ctx, lease, gpus, self.logs)
        self.checkpoints: CheckpointKeeper | None = None
        self.sandboxed: SandboxedRun | None = None
        self._stopped_for_preemption = False
        self.reporting = False  # the result is on its way: the job itself is over

    @property
    def invoke_id(self) -> str:
        return self.lease.invoke_id

    async def run(self) -> None:
        try:
            await self._run()
        finally:  # reported, or never to be: its warm sandbox's replacement may start
            if self.ctx.warm is not None:
                self.ctx.warm.reported(self.staging.job_dir)

    async def _run(self) -> None:
        started = time.monotonic()
        if not self.lease.started:  # a coordinator that does not start jobs at the lease
            try:
                await self.ctx.client.start(self.invoke_id, self.lease.lease_token)
            except StaleLease:
                log.info("invoke %s: lease stale before start; dropping", self.invoke_id)
                return
        self.logs.start()
        try:
            await self._run_and_report(started)
        finally:
            # The folders go once the result is on its way and nothing of the job runs: their
            # removal (~2 ms), like the rest of the processes' exit, is not the tenant's
            # wait. Nothing of the report reads them: the outputs are inline in it or
            # uploaded already.
            try:
                if self.sandboxed is not None:
                    await self.sandboxed.finished()
            finally:
                await self.staging.remove()

    async def _run_and_report(self, started: float) -> None:
        report: wire.ResultReport | None
        try:
            report = await self._execute(started)
        except JobFailed as failure:
            self.logs.line(f"failed: {failure.message}")
            report = self.reporter.failed(failure.code, failure.message, started)
        except Exception as exc:
            log.exception("invoke %s: agent error", self.invoke_id)
            message = f"the agent hit an internal error: {type(exc).__name__}: {exc}"
            self.logs.line(message)
            report = self.reporter.failed(ErrorCode.AGENT_ERROR, message, started)
        finally:
            await self.logs.stop()
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
            # the coordinator requeues it; its last checkpoint was uploaded above
            await self.reporter.send_preempted()
            return
        if report is None or self.outcome.dropped.is_set():
            log.info("invoke %s: lease lost; result not reported", self.invoke_id)
            return
        self.reporting = True
        self.successors = await self.reporter.send(report)

    async def _execute(self, started: float) -> wire.ResultReport | None:
        lease = self.lease
        if self.refusal is not None:
            raise JobFailed(ErrorCode.AGENT_ERROR, self.refusal)
        self.staging.make_folders()
        self.logs.line(
            f"invoke {self.invoke_id} attempt {lease.attempt}: {lease.runtime.value} "
            f"in the {self.ctx.sandbox.name} sandbox"
            + (f" on {', '.join(g.info.model for g in self.gpus)}" if self.gpus else "")
        )
        inputs, download_ms = await self.staging.fetch_inputs()
        options: dict[str, object] = {}
        if lease.runtime.kind == "train":
            self.checkpoints = CheckpointKeeper(
                self.ctx.client,
                lease,
                self.staging.job_dir,
                self.staging.staging_dir,
                self.logs,
                interval_sec=self.ctx.settings.checkpoint_interval_sec,
                max_bytes=self.ctx.settings.max_download_bytes,
            )
            options = await self.checkpoints.prepare()
            if lease.evaluate is not None:  # a spot check: score another node's model too
                options["evaluate"] = await evaluated.stage(
                    self.ctx.client,
                    lease.evaluate,
                    self.staging.job_dir,
                    self.logs,
                    max_bytes=self.ctx.settings.max_download_bytes,
                )
        run = self.sandboxed = SandboxedRun(
            self.ctx,
            lease,
            self.gpus,
            job_dir=self.staging.job_dir,
            logs=self.logs,
            outcome=self.outcome,
            checkpoints=self.checkpoints,
        )
        end = await run.run(run.prepare(inputs, options), started)
        return await self._conclude(run, end, started, download_ms)

    async def _conclude(
        self, run: SandboxedRun, end: RunEnd, started: float, download_ms: int
    ) -> wire.ResultReport | None:
        """What the run's end means for the tenant; None: nothing is to be reported."""
        lease = self.lease
        exit_code, stopped, limit_hit = end.exit_code, end.stopped, end.limit_hit
        if stopped == "dropped":
            return None
        if stopped == "preempted":
            if exit_code != 0 or run.read_result() is None:
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
            return self.reporter.ended(
                status, InvokeError(code=code, message=message), started, download_ms
            )
        result = run.read_result()
        peak = run.peak_gpu_bytes
        if limit_hit is not None and (result is None or not result.ok or limit_hit.limit == "disk"):
            self.logs.line(f"stopped at a limit: {limit_hit.message}")
            return self.reporter.ended(
                InvokeStatus.FAILED,
                InvokeError(code=ErrorCode.RESOURCE_LIMIT, message=limit_hit.message),
                started,
                download_ms,
                runtime=result.metrics if result is not None else None,
                peak_gpu_bytes=peak,
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
            return self.reporter.ended(
                InvokeStatus.FAILED,
                failure,
                started,
                download_ms,
                runtime=result.metrics,
                peak_gpu_bytes=peak,
            )
        metrics = self.reporter.metrics(result.metrics, started, download_ms, peak)
        assert result.outputs is not None
        outputs_path = self.staging.staging_dir / "outputs"
        try:
            await asyncio.to_thread(copy_out, self.staging.job_dir, result.outputs, outputs_path)
        except (OSError, UnsafeJobFile) as exc:
            raise JobFailed(
                ErrorCode.RUNTIME_ERROR, f"the runtime's outputs could not be read: {exc}"
            ) from exc
        delivered, error = await self.reporter.deliver(
            outputs_path, result.outputs_format or "npz", metrics
        )
        return wire.ResultReport(
            lease_token=lease.lease_token,
            status=InvokeStatus.FAILED if error else InvokeStatus.DONE,
            result=delivered,
            error=error,
        )
