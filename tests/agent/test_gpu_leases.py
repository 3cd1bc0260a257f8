"""The agent runs a leased job on exactly the GPUs the coordinator named, and refuses a
lease naming GPUs it does not have or that another job holds (SPEC §4.3, multi-GPU)."""

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pydantic import SecretStr

from gpu_share.agent.gpu import Nvml
from gpu_share.agent.sandbox import ProcessSandbox
from gpu_share.agent.settings import AgentSettings
from gpu_share.agent.worker import Agent
from gpu_share.protocol import agent as wire
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.testing.factories import HELLO_WORLD, ProviderHandle, TenantHandle
from tests.agent.test_gpu import FakeNvml


def make_agent(tmp_path: Path, app: FastAPI | None = None, token: str | None = None) -> Agent:
    return Agent(
        AgentSettings(
            server="http://testserver",
            token=SecretStr(token) if token else None,
            data_dir=tmp_path / "agent",
            lease_wait_sec=0.2,
            benchmarks=False,
        ),
        transport=httpx.ASGITransport(app=app) if app else None,
        sandbox=ProcessSandbox(),
        nvml=Nvml(FakeNvml(count=4)),  # type: ignore[arg-type]
        runtimes=[RuntimeName.ONNX_CUDA, RuntimeName.ONNX_CPU],
    )


def lease(
    gpus: int, indices: list[int] | None, runtime: RuntimeName = RuntimeName.ONNX_CUDA
) -> wire.LeasedJob:
    return wire.LeasedJob(
        invoke_id="inv_1",
        lease_token="t" * 32,
        lease_expires_at=datetime.now(UTC),
        attempt=1,
        runtime=runtime,
        model=wire.ArtifactRef(url="https://example.com/m.onnx", platform=False, sha256=None),
        inputs=None,
        timeout_sec=60,
        gpus=gpus,
        outputs_upload=None,
        inline_limit_bytes=1024,
        gpu_indices=indices,
    )


def test_a_job_gets_exactly_the_gpus_its_lease_names(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    gpus, refusal = agent._take_gpus(lease(2, [3, 1]))
    assert refusal is None
    assert [g.info.index for g in gpus] == [3, 1]
    assert [g.info.uuid for g in gpus] == [agent.gpus[3].info.uuid, agent.gpus[1].info.uuid]
    assert sorted(g.info.index for g in agent._free_gpus) == [0, 2]


def test_without_named_gpus_a_job_gets_the_first_free_ones(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    gpus, _ = agent._take_gpus(lease(2, None))
    assert [g.info.index for g in gpus] == [0, 1]
    assert agent._take_gpus(lease(0, None, RuntimeName.ONNX_CPU)) == ([], None)
    assert len(agent._free_gpus) == 2


@pytest.mark.parametrize(
    ("indices", "gpus", "why"),
    [
        pytest.param([1, 7], 2, "it has no GPU [7]", id="missing"),
        pytest.param([0, 2], 2, "GPU [0] is running another job", id="busy"),
        pytest.param([2], 2, "for a 2-GPU job", id="too-few"),
        pytest.param([2, 2], 2, "for a 2-GPU job", id="twice"),
    ],
)
def test_a_lease_for_gpus_the_agent_does_not_have_free_is_refused(
    tmp_path: Path, indices: list[int], gpus: int, why: str
) -> None:
    agent = make_agent(tmp_path)
    agent._take_gpus(lease(1, [0]))  # GPU 0 runs a job
    taken, refusal = agent._take_gpus(lease(gpus, indices))
    assert taken == [] and refusal is not None and why in refusal
    assert sorted(g.info.index for g in agent._free_gpus) == [1, 2, 3]  # nothing taken


async def eventually(check: Callable[[], Any], what: str, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_a_refused_lease_fails_the_invoke_saying_why_and_frees_nothing_it_did_not_hold(
    app: FastAPI,
    client: httpx.AsyncClient,
    provider: ProviderHandle,
    tenant: TenantHandle,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    agent = make_agent(tmp_path, app, provider.enrollment_token)
    asked: list[wire.LeaseRequest] = []
    real_lease = agent.client.lease

    async def wrong_gpus(request: wire.LeaseRequest) -> wire.LeaseResponse:
        """A coordinator that names a GPU this node does not have."""
        asked.append(request)
        response = await real_lease(request)
        for job in response.jobs:
            job.gpu_indices = [9]
        return response

    monkeypatch.setattr(agent.client, "lease", wrong_gpus)
    stop = asyncio.Event()
    running = asyncio.create_task(agent.run(stop, drain_timeout=0))
    try:
        await asyncio.wait_for(agent.online.wait(), 20)
        submitted = await client.post(
            "/v1/gpu/invoke", json={**HELLO_WORLD, "gpus": 1}, headers=tenant.headers
        )
        assert submitted.status_code == 202, submitted.text
        invoke_id = submitted.json()["id"]

        async def final() -> bool:
            state = await client.get(f"/v1/gpu/invokes/{invoke_id}", headers=tenant.headers)
            return bool(state.json()["status"] == "failed")

        await eventually(final, "the refused invoke to fail")
    finally:
        stop.set()
        await running
    state = (await client.get(f"/v1/gpu/invokes/{invoke_id}", headers=tenant.headers)).json()
    assert state["error"]["code"] == "AGENT_ERROR"
    assert "leased GPUs [9]" in state["error"]["message"]
    assert "it has no GPU [9]" in state["error"]["message"]
    assert asked[0].free_gpu_indices == [0, 1, 2, 3]
    assert sorted(g.info.index for g in agent._free_gpus) == [0, 1, 2, 3]
