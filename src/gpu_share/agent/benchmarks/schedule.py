"""When the node benchmarks itself, and how a run keeps off the node's work.

A run is due on the node's first start (no run recorded for this node id), every
`interval` after the last one, and when the coordinator's heartbeat answer says an
admin asked. It starts only once the node has had no job and no session for
`quiet_sec`; work always wins: a job or session that starts during a run stops it (the
measuring child is killed) and the run waits for the next quiet moment. So a run never
measures a GPU that a tenant is using, and a tenant never waits for a benchmark.

The last run's time is kept in the data folder, so a restart does not run it again.
"""

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from gpu_share.agent.benchmarks.suite import BenchmarkSuite
from gpu_share.agent.benchmarks.uplink import Uplink
from gpu_share.backoff import Backoff
from gpu_share.protocol.benchmarks import BenchmarkReport, BenchmarkTrigger
from gpu_share.protocol.nodes import GpuInfo

log = logging.getLogger(__name__)

POLL_SEC = 0.25  # how often a waiting or running benchmark looks for work
LONGEST_SLEEP_SEC = 3600.0


def _utcnow() -> datetime:
    return datetime.now(UTC)


async def _pause(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


class BenchmarkSchedule:
    def __init__(
        self,
        suite: BenchmarkSuite,
        *,
        state_path: Path,
        interval: timedelta,
        quiet_sec: float,
        now: Callable[[], datetime] = _utcnow,
        poll_sec: float = POLL_SEC,
    ) -> None:
        self.suite = suite
        self.state_path = state_path
        self.interval = interval
        self.quiet_sec = quiet_sec
        self.now = now
        self.poll_sec = poll_sec
        self.requested = False
        self.running = False
        self.reported: list[BenchmarkReport] = []  # this process's runs the coordinator took
        self.put_off = 0  # runs stopped because work arrived
        self._wake = asyncio.Event()
        self._settled_at = float("-inf")  # loop time the last report was answered

    def heard(self, run_benchmark: bool, asked_at: float) -> None:
        """A heartbeat answer, for a heartbeat sent at loop time `asked_at`.

        One sent before the last report was answered, or during a run, may still carry
        a request that run settles: only later answers count.
        """
        if run_benchmark and not self.running and asked_at >= self._settled_at:
            if not self.requested:
                log.info("the coordinator asks for a benchmark run")
            self.requested = True
            self._wake.set()

    def nudge(self) -> None:
        """Look again now whether a run is due (the clock or the saved state changed)."""
        self._wake.set()

    def last_run_at(self, node_id: str) -> datetime | None:
        try:
            state = json.loads(self.state_path.read_text())
            if state.get("node_id") != node_id:
                return None  # registered again: a new node, not benchmarked yet
            return datetime.fromisoformat(state["last_run_at"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def _remember(self, node_id: str, at: datetime) -> None:
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.state_path.with_name(self.state_path.name + ".part")
        partial.write_text(json.dumps({"node_id": node_id, "last_run_at": at.isoformat()}))
        os.replace(partial, self.state_path)

    def due(self, node_id: str) -> BenchmarkTrigger | None:
        if self.requested:
            return BenchmarkTrigger.REQUESTED
        last = self.last_run_at(node_id)
        if last is None:
            return BenchmarkTrigger.FIRST
        if self.now() - last >= self.interval:
            return BenchmarkTrigger.PERIODIC
        return None

    def _seconds_until_due(self, node_id: str) -> float:
        last = self.last_run_at(node_id)
        if last is None:
            return 0.0
        left = (last + self.interval - self.now()).total_seconds()
        return min(max(left, self.poll_sec), LONGEST_SLEEP_SEC)

    async def run(
        self,
        stop: asyncio.Event,
        *,
        node_id: str,
        gpus: list[GpuInfo],
        uplink: Uplink,
        busy: Callable[[], bool],
    ) -> None:
        """Benchmark whenever a run is due and the node is quiet, until `stop`."""
        retry = Backoff(first=30.0, cap=1800.0)
        while not stop.is_set():
            trigger = self.due(node_id)
            if trigger is None:
                self._wake.clear()
                waking = asyncio.create_task(self._wake.wait())
                stopping = asyncio.create_task(stop.wait())
                await asyncio.wait(
                    {waking, stopping},
                    timeout=self._seconds_until_due(node_id),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                waking.cancel()
                stopping.cancel()
                continue
            if not await self._quiet(stop, busy):
                return
            try:
                report = await self._measure_unless_busy(stop, busy, trigger, gpus, uplink)
            except Exception:
                log.exception("the benchmark failed; it runs again later")
                if not await retry.sleep(stop):
                    return
                continue
            if report is None:
                continue
            if await self._report(node_id, report, uplink):
                retry.reset()
            elif not await retry.sleep(stop):
                return

    async def _quiet(self, stop: asyncio.Event, busy: Callable[[], bool]) -> bool:
        """Wait until the node has had no work for `quiet_sec`; False when stopping."""
        loop = asyncio.get_running_loop()
        quiet_since: float | None = None
        while not stop.is_set():
            if busy():
                quiet_since = None
            else:
                quiet_since = loop.time() if quiet_since is None else quiet_since
                if loop.time() - quiet_since >= self.quiet_sec:
                    return True
            await _pause(stop, self.poll_sec)
        return False

    async def _measure_unless_busy(
        self,
        stop: asyncio.Event,
        busy: Callable[[], bool],
        trigger: BenchmarkTrigger,
        gpus: list[GpuInfo],
        uplink: Uplink,
    ) -> BenchmarkReport | None:
        log.info("benchmark (%s) starting", trigger.value)
        self.running = True
        task = asyncio.create_task(self.suite.run(trigger, gpus, uplink), name="agent:benchmark")
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=self.poll_sec)
                if not task.done() and (busy() or stop.is_set()):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                    if not stop.is_set():
                        self.put_off += 1
                        log.info("benchmark put off: work arrived; it runs when the node is idle")
                    return None
            return task.result()
        finally:
            self.running = False
            if not task.done():  # we are being cancelled: the run (and its child) goes too
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _report(self, node_id: str, report: BenchmarkReport, uplink: Uplink) -> bool:
        """Send the run; True once the coordinator has it (or refused it for good)."""
        try:
            run = await uplink.report_benchmark(report)
        except Exception as exc:
            if uplink.refused(exc):
                log.error("the coordinator refused the benchmark report: %s", exc)
                self._settle(node_id)
                return True
            why = uplink.describe(exc)
            log.warning("could not report the benchmark (%s); it runs again later", why)
            return False
        self._settle(node_id)
        self.reported.append(report)
        verdict = "passed" if run.passed else f"failed: {run.reason}"
        log.info(
            "benchmark (%s) reported in %d ms: %s",
            report.trigger.value,
            report.duration_ms,
            verdict,
        )
        return True

    def _settle(self, node_id: str) -> None:
        self._remember(node_id, self.now())
        self.requested = False
        self._settled_at = asyncio.get_running_loop().time()
