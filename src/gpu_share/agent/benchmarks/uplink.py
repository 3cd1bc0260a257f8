"""The benchmarks' way to the coordinator, which the agent hands them.

The network is measured over the agent's own connection (its pool, its TLS) and the run
is reported through it, yet the benchmarks import nothing of the agent: they take an
`Uplink`. The agent's worker makes one from its client (`worker.CoordinatorUplink`).
"""

from typing import Protocol

from gpu_share.protocol.benchmarks import BenchmarkReport, BenchmarkRun


class Uplink(Protocol):
    async def report_benchmark(self, report: BenchmarkReport) -> BenchmarkRun:
        """Send a run, retried through short outages; the coordinator's verdict on it."""

    async def benchmark_ping(self) -> None:
        """One round trip (`GET /v1/agent/benchmarks/ping`)."""

    async def benchmark_download(self, nbytes: int, seconds: float) -> int:
        """Bytes of `nbytes` the coordinator sent before `seconds` ran out."""

    async def benchmark_upload(self, nbytes: int, seconds: float) -> int:
        """Bytes the coordinator received of up to `nbytes` sent within `seconds`."""

    def describe(self, exc: BaseException) -> str:
        """Why something failed, in a few words ("connection refused", "timed out", "503 …")."""

    def refused(self, exc: BaseException) -> bool:
        """The coordinator answered no, for good: unlike an outage, a 5xx or a 429, trying
        again will not help."""
