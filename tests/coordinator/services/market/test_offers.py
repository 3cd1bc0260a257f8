"""The marketplace (SPEC §4.2): `GET /v1/offers` filters and sorts what can run work now,
and shows the scores placement ranks by, with their components."""

from typing import Any

import httpx
from fastapi import FastAPI

from gpu_share.protocol.reliability import (
    CompletionEvidence,
    Reliability,
    StabilityEvidence,
    UptimeEvidence,
)
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import ADMIN, TenantHandle
from gpu_share.testing.simulated_agent import H100, AgentFactory, inventory
from tests.coordinator.services.nodes.test_placement import closed_today, set_node
from tests.coordinator.services.work.test_preemption import console_page


async def offers(client: httpx.AsyncClient, tenant: TenantHandle, **params: Any) -> list[Any]:
    response = await client.get("/v1/offers", params=params, headers=tenant.headers)
    assert response.status_code == 200, response.text
    listed: list[Any] = response.json()
    return listed


def published(score: float, uptime: float) -> dict[str, Any]:
    """A score as the reliability loop stores it (its evidence is not what is tested here)."""
    return Reliability(
        score=score,
        uptime=uptime,
        completion=score,
        stability=1.0,
        uptime_evidence=UptimeEvidence(
            hours_in_windows=0, hours_online=0, weighted_hours=0, weighted_offline_hours=0
        ),
        completion_evidence=CompletionEvidence(
            jobs_counted=0,
            jobs_completed=0,
            provider_failures=0,
            weighted_jobs=0,
            weighted_failures=0,
        ),
        stability_evidence=StabilityEvidence(runs_counted=0, weighted_runs=0, weighted_drop=0),
        half_life_days=7,
        lookback_days=30,
        computed_at="2026-01-01T00:00:00Z",
    ).model_dump(mode="json")


async def test_offers_filter_sort_and_show_their_scores(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
) -> None:
    gpu = await sim_agent(
        inventory(runtimes=[RuntimeName.ONNX_CUDA, RuntimeName.ONNX_CPU], gpus=[H100]),
        verified=True,
    )
    cpu = await sim_agent(verified=True)
    await set_node(
        app,
        gpu,
        tier="enterprise",
        price_per_gpu_hour_micro=2_000_000,
        reliability=published(0.97, uptime=0.99),
        benchmark_state={"gpus": {H100.uuid: {"score": 0.93, "passed": True}}},
    )
    await set_node(app, cpu, reliability=published(0.6, uptime=0.6))
    everything = await offers(client, tenant)
    assert [o["node_id"] for o in everything] == [gpu.node_id, cpu.node_id]  # by rank
    top = everything[0]
    assert top["gpus"] == [
        {
            "model": H100.model,
            "count": 1,
            "vram_mb": H100.vram_mb,
            "cuda_version": "12.4",
            "benchmark_score": 0.93,
            "verified": True,
        }
    ]
    assert top["price_per_gpu_hour"] == "2" and top["reliability"]["uptime"] == 0.99
    assert set(top["rank_components"]) == {"reliability", "benchmark", "price", "enterprise"}

    assert [o["node_id"] for o in await offers(client, tenant, gpu_model="h100")] == [gpu.node_id]
    assert [o["node_id"] for o in await offers(client, tenant, max_price="1")] == [cpu.node_id]
    assert [o["node_id"] for o in await offers(client, tenant, min_reliability=0.9)] == [
        gpu.node_id
    ]
    assert (await offers(client, tenant, sort="price"))[0]["node_id"] == cpu.node_id
    assert await offers(client, tenant, runtime="catboost_cpu") == []
    assert await offers(client, tenant, gpus=2) == []
    assert await offers(client, tenant, min_vram_gb=100) == []

    await set_node(app, gpu, availability=closed_today(clock))
    await set_node(app, cpu, delisted=True)
    assert await offers(client, tenant) == []  # out of hours, delisted: not offered


async def test_offers_refuse_bad_filters_and_other_roles(
    client: httpx.AsyncClient, tenant: TenantHandle, provider: Any
) -> None:
    for params in ({"sort": "cheapest"}, {"min_reliability": 2}, {"max_price": "-1"}, {"gpus": 0}):
        response = await client.get("/v1/offers", params=params, headers=tenant.headers)
        assert response.status_code == 422, params
    admin = await client.get("/v1/offers", headers=ADMIN)
    assert admin.status_code == 200
    as_provider = await client.get(
        "/v1/offers", headers={"Authorization": f"Bearer {provider.key}"}
    )
    assert as_provider.status_code == 403


async def test_offers_show_the_memory_each_job_may_use(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    """The node's word (its agent's limit per job), else the share an agent gives each
    slot by default: RAM × 0.75 ÷ slots. On the marketplace page too."""
    told = await sim_agent(inventory(hostname="told", slots=2, job_memory_mb=5000), verified=True)
    # an agent that did not say
    older = await sim_agent(inventory(hostname="older", slots=2), verified=True)
    listed = {o["node_id"]: o for o in await offers(client, tenant)}
    assert listed[told.node_id]["memory_limit_mb"] == 5000
    assert listed[older.node_id]["memory_limit_mb"] == 16384 * 3 // 4 // 2
    page = await console_page(app, tenant, "/console/marketplace")
    assert '<span class="job-memory"' in page
    assert "4.9 GiB per job" in page and "6.0 GiB per job" in page
