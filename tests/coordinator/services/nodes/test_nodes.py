"""Providers, agent registration and discovery (SPEC §1.2, §3.2)."""

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy.orm.exc import DetachedInstanceError

from gpu_share.coordinator.services.nodes import nodes, placement
from gpu_share.protocol.nodes import Telemetry
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import ADMIN, ProviderHandle, TenantHandle, bearer
from gpu_share.testing.simulated_agent import H100, AgentFactory, SimulatedAgent, inventory


async def test_registered_node_is_listed_online_with_its_gpus(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    agent = await sim_agent(
        inventory(runtimes=[RuntimeName.ONNX_CPU, RuntimeName.ONNX_CUDA], gpus=[H100], region="eu")
    )
    listed = (await client.get("/v1/nodes", headers=tenant.headers)).json()
    assert [n["id"] for n in listed] == [agent.node_id]
    node = listed[0]
    assert node["status"] == "online"
    assert node["gpus"] == [
        {
            "model": "NVIDIA H100 80GB HBM3",
            "vram_mb": 81559,
            "driver_version": "550.54.15",
            "cuda_version": "12.4",
            "benchmark_score": None,
            "listed": True,
            "verified": False,  # no hardware challenge has passed yet
            "verified_at": None,
        }
    ]
    assert (node["verified"], node["verified_at"], node["spot_check_rate"]) == (False, None, None)
    assert node["runtimes"] == ["onnx_cpu", "onnx_cuda"]
    assert (node["region"], node["tier"]) == ("eu", "community")
    health = (await client.get("/health")).json()
    assert health["nodes_online"] == 1


async def test_runtimes_count_online_nodes_per_runtime(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    await sim_agent(inventory(runtimes=[RuntimeName.ONNX_CPU]))
    await sim_agent(inventory(runtimes=[RuntimeName.ONNX_CPU, RuntimeName.ONNX_CUDA], gpus=[H100]))
    runtimes = {
        r["name"]: r for r in (await client.get("/v1/gpu/runtimes", headers=tenant.headers)).json()
    }
    assert runtimes["onnx_cpu"] == {
        "name": "onnx_cpu",
        "kind": "inference",
        "device": "cpu",
        "nodes_online": 2,
    }
    assert runtimes["onnx_cuda"]["nodes_online"] == 1
    assert runtimes["catboost_cuda"] == {
        "name": "catboost_cuda",
        "kind": "train",
        "device": "cuda",
        "nodes_online": 0,
    }


async def test_node_turns_offline_after_missed_heartbeats_and_back_online(
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
) -> None:
    agent = await sim_agent()
    clock.advance(60)
    (node,) = (await client.get("/v1/nodes", headers=tenant.headers)).json()
    assert node["status"] == "offline"
    assert (await client.get("/health")).json()["nodes_online"] == 0
    await agent.heartbeat()
    (node,) = (await client.get("/v1/nodes", headers=tenant.headers)).json()
    assert node["status"] == "online"


async def test_registration_with_a_bad_enrollment_token_is_401(app: object) -> None:
    agent = SimulatedAgent(
        "http://testserver",
        transport=httpx.ASGITransport(app=app),  # type: ignore[arg-type]
    )
    try:
        response = await agent.client._http.post(
            "/v1/agent/register",
            json={"inventory": inventory().model_dump(mode="json")},
            headers=bearer("gpu_et_wrong"),
        )
    finally:
        await agent.aclose()
    assert response.status_code == 401
    assert "enrollment token" in response.json()["error"]["message"]


async def test_node_key_cannot_call_tenant_endpoints_and_tenant_key_cannot_lease(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    agent = await sim_agent()
    assert agent.client.key is not None and agent.client.key.startswith("gpu_ak_")
    assert (await client.get("/v1/artifacts", headers=bearer(agent.client.key))).status_code == 403
    leased = await client.post(
        "/v1/agent/lease", json={"slots": 1, "free_gpus": 0, "wait_sec": 0}, headers=tenant.headers
    )
    assert leased.status_code == 403


async def test_inventory_update_changes_what_the_node_offers(
    client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    agent = await sim_agent()
    ack = await agent.client.update_inventory(
        inventory(runtimes=[RuntimeName.ONNX_CPU, RuntimeName.CATBOOST_CPU], slots=3)
    )
    assert ack.node_id == agent.node_id
    (node,) = (await client.get("/v1/nodes", headers=tenant.headers)).json()
    assert node["runtimes"] == ["catboost_cpu", "onnx_cpu"]
    assert node["max_concurrent_jobs"] == 3


async def test_admin_lists_providers_and_provider_gets_keys_once(
    client: httpx.AsyncClient, provider: ProviderHandle
) -> None:
    assert provider.key.startswith("gpu_pk_")
    assert provider.enrollment_token.startswith("gpu_et_")
    listed = (await client.get("/v1/admin/providers", headers=ADMIN)).json()
    assert [p["id"] for p in listed] == [provider.id]
    assert "api_key" not in listed[0] and "enrollment_token" not in listed[0]


async def test_a_submit_reads_the_live_nodes_in_what_placement_reads(
    app: FastAPI, sim_agent: AgentFactory, clock: FrozenClock
) -> None:
    """`live_for_placement`: the columns placement reads, as the whole rows have them;
    the telemetry a heartbeat wrote is not read, and reading it raises."""
    agent = await sim_agent(inventory(gpus=[H100], region="eu"), verified=True)
    await agent.heartbeat(telemetry=Telemetry(cpu_pct=12.5, ram_used_mb=2048))
    settings = app.state.replica.settings
    async with app.state.replica.db.write() as session:
        (whole,) = await nodes.live_nodes(session, clock.now(), settings)
        (placed,) = await nodes.live_for_placement(session, clock.now(), settings)
    assert whole.telemetry  # the row has it
    for key in placement.READS:
        assert getattr(placed, key) == getattr(whole, key), key
    with pytest.raises(DetachedInstanceError):
        _ = placed.telemetry
