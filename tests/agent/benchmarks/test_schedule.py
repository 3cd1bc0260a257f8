"""When the agent benchmarks itself: on its first start, when asked, every interval; never
while a job runs or a session is open, and work that arrives stops a run.

The agent and the coordinator are real (in-process, over ASGI); the two GPUs are NVML's
stand-in from test_gpu.py, measured by a stand-in probe with the real result types.
"""

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pydantic import SecretStr

from gpu_share.agent.benchmarks.local import InThread, LocalJob, LocalResults
from gpu_share.agent.benchmarks.schedule import BenchmarkSchedule
from gpu_share.agent.benchmarks.suite import BenchmarkSuite
from gpu_share.agent.client import CoordinatorClient, CoordinatorError
from gpu_share.agent.gpu import Nvml
from gpu_share.agent.sandbox import ProcessSandbox
from gpu_share.agent.settings import AgentSettings
from gpu_share.agent.worker import Agent, CoordinatorUplink
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.nodes import gpu_catalog
from gpu_share.protocol.benchmarks import BenchmarkTrigger, CpuMeasurement, GpuMeasurement
from gpu_share.protocol.nodes import GpuInfo
from gpu_share.testing.factories import ADMIN, ProviderHandle
from gpu_share.testing.simulated_agent import AgentFactory
from tests.agent.test_gpu import FakeNvml

MiB = 1024 * 1024
WAIT_SEC = 60.0  # a deadline for what must happen, never a measure of how fast


async def eventually(check: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_SEC
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"never happened: {what}")
        await asyncio.sleep(0.02)


def l4_like(gpu: GpuInfo, ordinal: int, budget_sec: float) -> GpuMeasurement:
    """What PyTorch would measure on an L4, whatever NVML calls the card."""
    l4 = gpu_catalog.REFERENCES["l4-24gb"]
    return GpuMeasurement(
        index=gpu.index,
        uuid=gpu.uuid,
        model=gpu.model,
        backend="torch (simulated)",
        fp32_tflops=l4.fp32_tflops * 0.8,
        fp16_tflops=l4.fp16_tflops * 0.8,
        bf16_tflops=l4.bf16_tflops * 0.8,
        tf32_tflops=l4.tf32_tflops * 0.8,
        memory_bandwidth_gbs=l4.memory_bandwidth_gbs * 0.8,
    )


def quick_cpu(budget_sec: float, cores: int) -> CpuMeasurement:
    return CpuMeasurement(cores=cores, matmul_gflops=64.0 * cores, memory_bandwidth_gbs=10.0)


def fake_job(invoke_id: str) -> Any:
    """What the heartbeat loop reads of a running job."""
    return SimpleNamespace(
        invoke_id=invoke_id,
        lease=SimpleNamespace(lease_token="t" * 32),
        outcome=SimpleNamespace(canceled=asyncio.Event(), dropped=asyncio.Event()),
    )


async def test_the_agent_waits_for_its_job_to_end_then_benchmarks_and_runs_again_when_asked(
    app: FastAPI,
    client: httpx.AsyncClient,
    provider: ProviderHandle,
    settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings.heartbeat_interval_sec = 0.2
    probed: list[str] = []

    def probe(gpu: GpuInfo, ordinal: int, budget_sec: float) -> GpuMeasurement:
        probed.append(gpu.uuid)
        return l4_like(gpu, ordinal, budget_sec)

    agent = Agent(
        AgentSettings(
            server="http://testserver",
            token=SecretStr(provider.enrollment_token),
            data_dir=tmp_path / "agent",
            lease_wait_sec=0.2,
            benchmark_quiet_sec=0,
        ),
        transport=httpx.ASGITransport(app=app),
        sandbox=ProcessSandbox(),
        nvml=Nvml(FakeNvml()),  # type: ignore[arg-type]
        runtimes=[],
        benchmark_suite=BenchmarkSuite(
            scratch_dir=tmp_path / "scratch",
            measurer=InThread(gpu_probe=probe, cpu_probe=quick_cpu),
            storage_bytes=4 * MiB,
        ),
    )
    agent.jobs["inv_running"] = fake_job("inv_running")
    looked = asyncio.Event()
    looks = 0

    def busy() -> bool:
        nonlocal looks
        looks += 1
        if looks >= 20:
            looked.set()
        return Agent.busy(agent)

    monkeypatch.setattr(agent, "busy", busy)
    stop = asyncio.Event()
    running = asyncio.create_task(agent.run(stop, drain_timeout=0))
    try:
        await agent.online.wait()
        await looked.wait()  # it has looked many times, and found a job every time
        assert probed == [] and agent.benchmarks.reported == []

        del agent.jobs["inv_running"]
        await eventually(lambda: len(agent.benchmarks.reported) == 1, "the first run")
        first = agent.benchmarks.reported[0]
        assert first.trigger is BenchmarkTrigger.FIRST
        assert [g.index for g in first.gpus] == [0, 1] and probed == [g.uuid for g in first.gpus]
        assert first.storage is not None and first.network is not None
        assert first.network.download_mbps and first.network.upload_mbps

        provider_headers = {"Authorization": f"Bearer {provider.key}"}
        runs = await client.get(
            f"/v1/provider/nodes/{agent.node_id}/benchmarks", headers=provider_headers
        )
        (run,) = runs.json()
        assert run["trigger"] == "first" and run["passed"] is False
        assert [g["performs_like"] for g in run["gpus"]] == ["l4-24gb", "l4-24gb"]

        asked = await client.post(f"/v1/admin/nodes/{agent.node_id}/benchmark", headers=ADMIN)
        assert asked.status_code == 202
        await eventually(lambda: len(agent.benchmarks.reported) == 2, "the requested run")
        assert agent.benchmarks.reported[1].trigger is BenchmarkTrigger.REQUESTED
        await eventually(
            lambda: not agent.benchmarks.requested and not agent.benchmarks.running,
            "the request settled",
        )
    finally:
        stop.set()
        await running
    assert len(agent.benchmarks.reported) == 2  # the request was run once
    state = (tmp_path / "agent" / "benchmarks.json").read_text()
    assert agent.node_id is not None and agent.node_id in state


class BlockingMeasurer:
    """Measures only when allowed to; records how each measurement ended."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.allowed = asyncio.Event()
        self.cancelled = 0

    async def measure(self, job: LocalJob) -> LocalResults:
        self.started.set()
        try:
            await self.allowed.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            self.started.clear()
            raise
        return LocalResults(cpu=quick_cpu(job.budget_sec, job.cores))


def schedule_for(
    tmp_path: Path, measurer: Any, *, now: Callable[[], datetime] | None = None
) -> BenchmarkSchedule:
    return BenchmarkSchedule(
        BenchmarkSuite(scratch_dir=tmp_path / "scratch", measurer=measurer),
        state_path=tmp_path / "benchmarks.json",
        interval=timedelta(hours=24),
        quiet_sec=0,
        poll_sec=0.01,
        **({"now": now} if now else {}),
    )


async def running_schedule(
    schedule: BenchmarkSchedule, client: CoordinatorClient, node_id: str, busy: Callable[[], bool]
) -> tuple[asyncio.Event, Callable[[], Awaitable[None]]]:
    stop = asyncio.Event()
    task = asyncio.create_task(
        schedule.run(stop, node_id=node_id, gpus=[], uplink=CoordinatorUplink(client), busy=busy)
    )

    async def finish() -> None:
        stop.set()
        await task

    return stop, finish


async def test_work_that_arrives_stops_a_run_which_runs_again_when_the_node_is_idle(
    sim_agent: AgentFactory, tmp_path: Path
) -> None:
    node = await sim_agent()
    assert node.node_id is not None
    measurer = BlockingMeasurer()
    schedule = schedule_for(tmp_path, measurer)
    work = False
    _, finish = await running_schedule(schedule, node.client, node.node_id, lambda: work)
    try:
        await measurer.started.wait()
        work = True  # a job was leased: the run must give way
        await eventually(lambda: schedule.put_off == 1, "the run was stopped")
        assert measurer.cancelled == 1 and schedule.reported == []
        measurer.allowed.set()
        work = False
        await eventually(lambda: len(schedule.reported) == 1, "the run after the job")
        assert schedule.reported[0].trigger is BenchmarkTrigger.FIRST
    finally:
        await finish()


async def test_first_then_periodic_then_nothing_until_the_interval_passes(
    sim_agent: AgentFactory, tmp_path: Path
) -> None:
    node = await sim_agent()
    assert node.node_id is not None
    clock = [datetime(2026, 3, 1, tzinfo=UTC)]
    measurer = BlockingMeasurer()
    measurer.allowed.set()
    schedule = schedule_for(tmp_path, measurer, now=lambda: clock[0])
    assert schedule.due(node.node_id) is BenchmarkTrigger.FIRST
    _, finish = await running_schedule(schedule, node.client, node.node_id, lambda: False)
    try:
        await eventually(lambda: len(schedule.reported) == 1, "the first run")
        assert schedule.due(node.node_id) is None
        clock[0] += timedelta(hours=23)
        assert schedule.due(node.node_id) is None
        clock[0] += timedelta(hours=1)
        assert schedule.due(node.node_id) is BenchmarkTrigger.PERIODIC
        schedule.nudge()  # it sleeps until the run is due by the real clock
        await eventually(lambda: len(schedule.reported) == 2, "the periodic run")
        assert schedule.reported[1].trigger is BenchmarkTrigger.PERIODIC
    finally:
        await finish()
    # Another node id (the agent registered again) has not been benchmarked yet.
    assert schedule.due("nod_another") is BenchmarkTrigger.FIRST


async def test_a_request_heard_during_a_run_or_from_before_its_report_is_not_a_new_one(
    tmp_path: Path,
) -> None:
    schedule = schedule_for(tmp_path, BlockingMeasurer())
    schedule.running = True
    schedule.heard(True, asked_at=0.0)
    assert schedule.requested is False
    schedule.running = False
    schedule._settle("nod_x")  # a run was reported just now
    settled = asyncio.get_running_loop().time()
    schedule.heard(True, asked_at=settled - 1)  # answered before the report landed
    assert schedule.requested is False
    schedule.heard(True, asked_at=settled + 1)
    assert schedule.due("nod_x") is BenchmarkTrigger.REQUESTED


@pytest.mark.parametrize(
    ("error", "refused"),
    [
        (CoordinatorError(422, "VALIDATION_ERROR", "bad report"), True),
        (CoordinatorError(403, "FORBIDDEN", "not this node"), True),
        (CoordinatorError(503, "UNAVAILABLE", "starting"), False),
        (CoordinatorError(429, "RATE_LIMITED", "slow down"), False),
        (httpx.ConnectError("connection refused"), False),
        (RuntimeError("anything else"), False),
    ],
)
def test_the_agents_uplink_counts_only_a_coordinators_lasting_no_as_refused(
    error: BaseException, refused: bool
) -> None:
    """A refused report is settled, not sent again; an outage, a 5xx or a 429 is retried."""
    uplink = CoordinatorUplink(CoordinatorClient("http://127.0.0.1:9"))
    assert uplink.refused(error) is refused
    assert uplink.describe(httpx.ReadTimeout("slow")) == "timed out"
