"""Leases (DESIGN.md): guarded updates, expiry, requeue, exactly-once results, and the next
job leased with a result. Which jobs a lease takes is test_claims'."""

import base64
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from gpu_share.agent.client import StaleLease
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.loops import lease_expiry
from gpu_share.protocol.agent import LeaseRequest, LeaseVerdict
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import HELLO_WORLD, TenantHandle
from gpu_share.testing.simulated_agent import H100, AgentFactory, done_report, inventory

CPU_HELLO = {**HELLO_WORLD, "runtime": "onnx_cpu"}


async def submit(
    client: httpx.AsyncClient, tenant: TenantHandle, body: dict[str, Any] = CPU_HELLO
) -> str:
    response = await client.post("/v1/gpu/invoke", json=body, headers=tenant.headers)
    assert response.status_code == 202, response.text
    invoke_id: str = response.json()["id"]
    return invoke_id


async def status_of(
    client: httpx.AsyncClient, tenant: TenantHandle, invoke_id: str
) -> dict[str, Any]:
    body: dict[str, Any] = (
        await client.get(f"/v1/gpu/invokes/{invoke_id}", headers=tenant.headers)
    ).json()
    return body


async def test_result_is_recorded_with_metrics_and_inline_outputs(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    agent = await sim_agent()
    invoke_id = await submit(client, tenant)
    (job,) = await agent.lease()
    await agent.complete(job, outputs=b"NPZ!")
    state = await status_of(client, tenant, invoke_id)
    assert state["status"] == "done"
    assert state["node_id"] == agent.node_id
    result = state["result"]
    assert base64.b64decode(result["outputs_inline_base64"]) == b"NPZ!"
    assert result["outputs_format"] == "npz"
    assert result["metrics"]["device"] == "cpu"
    assert result["metrics"]["queue_ms"] is not None
    assert state["finished_at"] is not None


async def test_a_retried_result_report_is_accepted_once(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    agent = await sim_agent()
    invoke_id = await submit(client, tenant)
    (job,) = await agent.lease()
    await agent.complete(job)
    await agent.client.report(job.invoke_id, done_report(job, b"other"), retry_for=0)
    state = await status_of(client, tenant, invoke_id)
    assert base64.b64decode(state["result"]["outputs_inline_base64"]) == b"sim-outputs"


async def test_expired_lease_requeues_and_the_late_result_is_refused(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
    settings: Settings,
) -> None:
    lost, healthy = await sim_agent(), await sim_agent()
    invoke_id = await submit(client, tenant)
    (stale_job,) = await lost.lease()
    await lost.client.start(stale_job.invoke_id, stale_job.lease_token)
    clock.advance(settings.lease_ttl_sec + 1)
    report = await lease_expiry.run_once(app.state.replica)
    assert report.requeued == 1
    assert (await status_of(client, tenant, invoke_id))["status"] == "queued"

    (job,) = await healthy.lease()
    assert job.attempt == 2 and job.lease_token != stale_job.lease_token
    with pytest.raises(StaleLease):
        await lost.client.report(invoke_id, done_report(stale_job, b"late"), retry_for=0)
    ack = await lost.heartbeat([stale_job])
    assert ack.leases[0].verdict is LeaseVerdict.DROP
    await healthy.complete(job, b"on time")
    state = await status_of(client, tenant, invoke_id)
    assert (state["status"], state["attempts"], state["node_id"]) == ("done", 2, healthy.node_id)
    assert base64.b64decode(state["result"]["outputs_inline_base64"]) == b"on time"
    logs = (await client.get(f"/v1/gpu/invokes/{invoke_id}/logs", headers=tenant.headers)).text
    assert "stopped responding; requeued (attempt 1 of 3)" in logs


async def test_heartbeats_keep_a_long_job_leased(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
    settings: Settings,
) -> None:
    agent = await sim_agent()
    invoke_id = await submit(client, tenant)
    (job,) = await agent.lease()
    for _ in range(5):
        clock.advance(settings.lease_ttl_sec * 0.8)
        ack = await agent.heartbeat([job])
        assert ack.leases[0].verdict is LeaseVerdict.KEEP
        await lease_expiry.run_once(app.state.replica)
    assert (await status_of(client, tenant, invoke_id))["status"] == "assigned"


async def test_an_invoke_fails_after_max_attempts(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
    settings: Settings,
) -> None:
    agent = await sim_agent()
    invoke_id = await submit(client, tenant)
    for _ in range(settings.max_attempts):
        (job,) = await agent.lease()
        clock.advance(settings.lease_ttl_sec + 1)
        await agent.heartbeat()  # the node is alive, the job's lease is not
        await lease_expiry.run_once(app.state.replica)
    state = await status_of(client, tenant, invoke_id)
    assert state["status"] == "failed"
    assert state["error"]["code"] == "LEASE_EXPIRED"
    assert state["attempts"] == settings.max_attempts
    assert await agent.lease() == []
    # The last attempt's node reports late: told its lease is stale, not that its result
    # was taken (the invoke stays failed; it was not a retry of a recorded report).
    with pytest.raises(StaleLease):
        await agent.client.report(job.invoke_id, done_report(job), retry_for=0)
    assert (await status_of(client, tenant, invoke_id))["status"] == "failed"


async def test_a_job_overrunning_its_timeout_is_ended_by_the_coordinator(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
    settings: Settings,
) -> None:
    agent = await sim_agent()
    invoke_id = await submit(client, tenant, {**CPU_HELLO, "timeout_sec": 60})
    (job,) = await agent.lease()
    await agent.client.start(job.invoke_id, job.lease_token)
    for _ in range(10):
        clock.advance(10)
        await agent.heartbeat([job])
        await lease_expiry.run_once(app.state.replica)
    state = await status_of(client, tenant, invoke_id)
    assert state["status"] == "timeout"
    assert state["error"]["code"] == "TIMEOUT"


async def test_stale_tokens_are_refused_for_start_and_logs(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    agent = await sim_agent()
    await submit(client, tenant)
    (job,) = await agent.lease()
    with pytest.raises(StaleLease):
        await agent.client.start(job.invoke_id, "0" * 32)
    with pytest.raises(StaleLease):
        await agent.client.append_logs(job.invoke_id, "0" * 32, "x")


async def test_a_lease_that_asks_start_is_the_start(
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
) -> None:
    agent = await sim_agent()
    invoke_id = await submit(client, tenant, {**CPU_HELLO, "timeout_sec": 120})
    (job,) = await agent.lease(start=True)
    assert job.started
    state = await status_of(client, tenant, invoke_id)
    assert state["status"] == "running" and state["started_at"] is not None
    await agent.client.start(job.invoke_id, job.lease_token)  # an old agent's start: harmless
    clock.advance(30)
    await agent.client.report(invoke_id, done_report(job, b"ok"), retry_for=0)
    state = await status_of(client, tenant, invoke_id)
    assert state["status"] == "done" and state["attempts"] == 1
    assert base64.b64decode(state["result"]["outputs_inline_base64"]) == b"ok"


async def test_the_last_log_lines_travel_with_the_result_once(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    agent = await sim_agent()
    invoke_id = await submit(client, tenant)
    (job,) = await agent.lease(start=True)
    assert await agent.client.append_logs(invoke_id, job.lease_token, "first line\n") is (
        LeaseVerdict.KEEP
    )
    report = done_report(job).model_copy(update={"log": "last line\n"})
    await agent.client.report(invoke_id, report, retry_for=0)
    await agent.client.report(invoke_id, report, retry_for=0)  # a retry adds nothing
    logs = (await client.get(f"/v1/gpu/invokes/{invoke_id}/logs", headers=tenant.headers)).text
    assert logs.count("last line") == 1
    assert logs.index("first line") < logs.index("last line")


async def test_a_stale_result_brings_no_log_lines(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
    settings: Settings,
) -> None:
    lost, healthy = await sim_agent(), await sim_agent()
    invoke_id = await submit(client, tenant)
    (stale,) = await lost.lease(start=True)
    clock.advance(settings.lease_ttl_sec + 1)
    assert (await lease_expiry.run_once(app.state.replica)).requeued == 1
    (job,) = await healthy.lease(start=True)
    late = done_report(stale, b"late").model_copy(update={"log": "from the lost node\n"})
    with pytest.raises(StaleLease):
        await lost.client.report(invoke_id, late, retry_for=0)
    await healthy.complete(job, b"on time")
    logs = (await client.get(f"/v1/gpu/invokes/{invoke_id}/logs", headers=tenant.headers)).text
    assert "from the lost node" not in logs
    assert (await status_of(client, tenant, invoke_id))["status"] == "done"


def _with_next(report: Any, **request: Any) -> Any:
    lease = LeaseRequest.model_validate({"slots": 1, "free_gpus": 0, "start": True, **request})
    return report.model_copy(update={"next": lease})


async def test_a_result_that_asks_next_leases_the_slots_next_job_in_the_same_request(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    agent = await sim_agent()
    first, second = await submit(client, tenant), await submit(client, tenant)
    (job,) = await agent.lease(start=True)
    assert job.invoke_id == first

    (following,) = await agent.client.report(first, _with_next(done_report(job)), retry_for=0)

    assert following.invoke_id == second and following.started
    assert (await status_of(client, tenant, first))["status"] == "done"
    assert (await status_of(client, tenant, second))["status"] == "running"
    # The queue is empty now: the next result brings nothing, and says so.
    assert await agent.client.report(second, _with_next(done_report(following)), retry_for=0) == []
    assert (await status_of(client, tenant, second))["status"] == "done"


async def test_a_result_without_next_leases_nothing(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    agent = await sim_agent()
    first, second = await submit(client, tenant), await submit(client, tenant)
    (job,) = await agent.lease(start=True)

    assert await agent.client.report(first, done_report(job), retry_for=0) == []

    assert (await status_of(client, tenant, second))["status"] == "queued"


async def test_a_stale_result_leases_nothing_even_when_it_asks_next(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
    settings: Settings,
) -> None:
    lost = await sim_agent()
    invoke_id = await submit(client, tenant)
    (stale,) = await lost.lease(start=True)
    waiting = await submit(client, tenant)
    clock.advance(settings.lease_ttl_sec + 1)
    assert (await lease_expiry.run_once(app.state.replica)).requeued == 1

    with pytest.raises(StaleLease):
        await lost.client.report(invoke_id, _with_next(done_report(stale)), retry_for=0)

    assert (await status_of(client, tenant, invoke_id))["status"] == "queued"
    assert (await status_of(client, tenant, waiting))["status"] == "queued"


async def test_next_is_offered_only_the_gpus_the_report_names(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    gpu = await sim_agent(
        inventory(runtimes=[RuntimeName.ONNX_CUDA, RuntimeName.ONNX_CPU], gpus=[H100] * 2, slots=2),
        verified=True,
    )
    first = await submit(client, tenant, {**HELLO_WORLD, "gpu_model": "H100"})
    (job,) = await gpu.lease(slots=1, free_gpus=2, free_gpu_indices=[0, 1], start=True)
    assert job.gpu_indices is not None
    (held,) = job.gpu_indices
    second = await submit(client, tenant, {**HELLO_WORLD, "gpu_model": "H100"})

    (following,) = await gpu.client.report(
        first, _with_next(done_report(job), free_gpus=1, free_gpu_indices=[held]), retry_for=0
    )

    assert following.invoke_id == second and following.gpu_indices == [held]
