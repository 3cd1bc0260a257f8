"""One run of the whole suite: the node's own measurements, then the network.

The parts run one after the other, never side by side: the network test's CPU work
would otherwise lower the CPU's figures. A part that fails leaves its figures out and
says why in `errors`; the run still reports what it measured.
"""

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from gpu_share.agent.benchmarks import compute, network, storage
from gpu_share.agent.benchmarks.local import InChildProcess, LocalJob, LocalMeasurer, LocalResults
from gpu_share.agent.benchmarks.uplink import Uplink
from gpu_share.protocol.benchmarks import (
    MAX_ERROR_CHARS,
    MAX_ERRORS,
    BenchmarkReport,
    BenchmarkTrigger,
    NetworkMeasurement,
)
from gpu_share.protocol.nodes import GpuInfo

log = logging.getLogger(__name__)

BUDGET_SEC = 1.0  # timing per figure, after its warm-up


def _utcnow() -> datetime:
    return datetime.now(UTC)


class BenchmarkSuite:
    def __init__(
        self,
        *,
        scratch_dir: Path,
        measurer: LocalMeasurer | None = None,
        budget_sec: float = BUDGET_SEC,
        storage_bytes: int = storage.STORAGE_BYTES,
        now: Callable[[], datetime] = _utcnow,
    ) -> None:
        self.scratch_dir = scratch_dir
        self.measurer = measurer or InChildProcess()
        self.budget_sec = budget_sec
        self.storage_bytes = storage_bytes
        self.now = now

    async def run(
        self, trigger: BenchmarkTrigger, gpus: list[GpuInfo], uplink: Uplink
    ) -> BenchmarkReport:
        started_at = self.now()
        started = time.perf_counter()
        errors: list[str] = []
        job = LocalJob(
            gpus=gpus,
            scratch_dir=self.scratch_dir,
            budget_sec=self.budget_sec,
            storage_bytes=self.storage_bytes,
            cores=compute.available_cores(),
        )
        try:
            local = await self.measurer.measure(job)
        except Exception as exc:
            errors.append(f"measuring this machine failed: {uplink.describe(exc)}")
            local = LocalResults()
        measured_network: NetworkMeasurement | None = None
        try:
            measured_network = await network.measure_network(uplink)
        except Exception as exc:
            why = uplink.describe(exc)
            errors.append(f"measuring the network to the coordinator failed: {why}")
        return BenchmarkReport(
            trigger=trigger,
            started_at=started_at,
            duration_ms=int((time.perf_counter() - started) * 1000),
            gpus=local.gpus,
            cpu=local.cpu,
            network=measured_network,
            storage=local.storage,
            errors=[e[:MAX_ERROR_CHARS] for e in (errors + local.errors)][:MAX_ERRORS],
        )
