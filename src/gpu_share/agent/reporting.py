"""A job's report: its metrics, its outputs delivered, the `ResultReport` sent.

The runtime's `RuntimeMetrics` become the tenant's `Metrics`, with what only the agent
measures added (the job's duration, download time, peak GPU memory). The outputs go
inline, to the tenant's presigned URL or to platform storage, in that order of fit; a
tenant whose storage is full gets QUOTA_EXCEEDED, saying what to delete. A report is
retried through a coordinator outage; one the coordinator refuses as stale is dropped.
"""

import asyncio
import base64
import logging
import time
from pathlib import Path

from gpu_share.agent.client import CoordinatorError, StaleLease
from gpu_share.agent.failures import JobFailed
from gpu_share.agent.gpu import Gpu
from gpu_share.agent.jobcontext import JobContext
from gpu_share.agent.logstream import LogStream
from gpu_share.agent.runtimes.jobspec import RuntimeMetrics
from gpu_share.hashing import sha256_file
from gpu_share.netguard import FetchError
from gpu_share.protocol import agent as wire
from gpu_share.protocol.errors import ErrorCode
from gpu_share.protocol.invokes import InvokeError, InvokeResult, InvokeStatus, Metrics

log = logging.getLogger(__name__)

REPORT_RETRY_SEC = 3600.0  # keep trying to report through a coordinator outage


class JobReporter:
    def __init__(
        self, ctx: JobContext, lease: wire.LeasedJob, gpus: list[Gpu], logs: LogStream
    ) -> None:
        self.ctx = ctx
        self.lease = lease
        self.gpus = gpus
        self.logs = logs

    @property
    def invoke_id(self) -> str:
        return self.lease.invoke_id

    def failed(self, code: str, message: str, started: float) -> wire.ResultReport:
        return self.ended(InvokeStatus.FAILED, InvokeError(code=code, message=message), started)

    def ended(
        self,
        status: InvokeStatus,
        error: InvokeError,
        started: float,
        download_ms: int | None = None,
        runtime: RuntimeMetrics | None = None,
        peak_gpu_bytes: int | None = None,
    ) -> wire.ResultReport:
        metrics = self.metrics(runtime, started, download_ms, peak_gpu_bytes)
        return wire.ResultReport(
            lease_token=self.lease.lease_token,
            status=status,
            error=error,
            result=InvokeResult(metrics=metrics),
        )

    def metrics(
        self,
        runtime: RuntimeMetrics | None,
        started: float,
        download_ms: int | None,
        peak_gpu_bytes: int | None = None,
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
            peak_gpu_memory_bytes=peak_gpu_bytes,
            extra={**runtime.extra, "load_ms": runtime.load_ms},
        )

    async def deliver(
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

    async def send(self, report: wire.ResultReport) -> list[wire.LeasedJob]:
        """Report the result; the jobs leased with it (see `ResultReport.next`)."""
        try:
            handed_on = await self.ctx.client.report(
                self.invoke_id, report, retry_for=REPORT_RETRY_SEC
            )
        except StaleLease:
            log.info("invoke %s: the coordinator refused the result (lease stale)", self.invoke_id)
            return []
        log.debug("invoke %s: %s, reported", self.invoke_id, report.status.value)
        return handed_on

    async def send_preempted(self) -> None:
        """The job stopped for on-demand work: the coordinator requeues it."""
        try:
            await self.ctx.client.report_preempted(
                self.invoke_id, self.lease.lease_token, retry_for=REPORT_RETRY_SEC
            )
        except StaleLease:
            log.info("invoke %s: preemption not confirmed (lease stale)", self.invoke_id)
