"""Providers' prices (SPEC §3.4): set, listed and removed per GPU model; nodes, the
marketplace and placement follow at once; bad input changes nothing; recommendations
come from other providers' offers weighted by their use, or honestly from nothing."""

from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import select

from gpu_share.coordinator.core.ids import new_id
from gpu_share.coordinator.core.orm import InvokeRow, NodeRow
from gpu_share.coordinator.services.market.price_recommendations import (
    percentile_of,
    weighted_quantile,
)
from gpu_share.coordinator.services.nodes import prices
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import (
    ProviderHandle,
    TenantHandle,
    bearer,
    create_provider,
    create_tenant,
)
from gpu_share.testing.simulated_agent import H100, AgentFactory, SimulatedAgent, inventory
from tests.coordinator.services.nodes.test_placement import set_node
from tests.protocol.test_money import OFF_PATTERN

H100_PATH = f"/v1/provider/prices/{quote(H100.model)}"
GPU_RUNTIMES = [RuntimeName.ONNX_CUDA, RuntimeName.ONNX_CPU]


def gpu_node(region: str | None = None, hostname: str = "gpu-box") -> Any:
    return inventory(runtimes=GPU_RUNTIMES, gpus=[H100], region=region, hostname=hostname)


async def put_price(
    client: httpx.AsyncClient, provider: ProviderHandle, path: str, body: dict[str, Any]
) -> httpx.Response:
    return await client.put(path, json=body, headers=bearer(provider.key))


async def my_prices(client: httpx.AsyncClient, provider: ProviderHandle) -> dict[str, Any]:
    response = await client.get("/v1/provider/prices", headers=bearer(provider.key))
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def node_prices(client: httpx.AsyncClient, tenant: TenantHandle) -> dict[str, Any]:
    nodes = (await client.get("/v1/nodes", headers=tenant.headers)).json()
    return {n["id"]: n["price_per_gpu_hour"] for n in nodes}


async def test_a_price_is_set_listed_changed_and_removed_and_nodes_and_offers_follow(
    client: httpx.AsyncClient,
    provider: ProviderHandle,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
) -> None:
    gpu = await sim_agent(gpu_node(), verified=True)
    cpu = await sim_agent(verified=True)
    assert await my_prices(client, provider) == {
        "prices": [],
        "unpriced_models": [H100.model, "cpu"],
    }
    assert await node_prices(client, tenant) == {gpu.node_id: None, cpu.node_id: None}

    answer = await put_price(
        client, provider, H100_PATH, {"price_per_gpu_hour": "2.5", "spot_discount_pct": 40}
    )
    assert answer.status_code == 200, answer.text
    price = answer.json()
    assert price["price_per_gpu_hour"] == "2.5" and price["spot_price_per_gpu_hour"] == "1.5"
    assert price["spot_discount_pct"] == 40 and price["machines"] == 1
    listed = await my_prices(client, provider)
    assert [p["gpu_model"] for p in listed["prices"]] == [H100.model]
    assert listed["unpriced_models"] == ["cpu"]
    assert await node_prices(client, tenant) == {gpu.node_id: "2.5", cpu.node_id: None}
    offers = (await client.get("/v1/offers", headers=tenant.headers)).json()
    assert {o["node_id"]: o["price_per_gpu_hour"] for o in offers}[gpu.node_id] == "2.5"
    cheap = await client.get("/v1/offers", params={"max_price": "2"}, headers=tenant.headers)
    assert [o["node_id"] for o in cheap.json()] == [cpu.node_id]  # the filter reads it too

    # An integer of USDC is a price too; the model name matches regardless of case.
    lower = f"/v1/provider/prices/{quote(H100.model.lower())}"
    changed = await put_price(
        client, provider, lower, {"price_per_gpu_hour": 3, "spot_discount_pct": 70}
    )
    assert changed.json()["gpu_model"] == H100.model
    assert changed.json()["spot_price_per_gpu_hour"] == "0.9"
    assert await node_prices(client, tenant) == {gpu.node_id: "3", cpu.node_id: None}

    # The spot price is the price less the discount, the discount rounded down.
    tiny = await put_price(
        client,
        provider,
        "/v1/provider/prices/cpu",
        {"price_per_gpu_hour": "0.000003", "spot_discount_pct": 50},
    )
    assert tiny.json()["spot_price_per_gpu_hour"] == "0.000002"
    assert await node_prices(client, tenant) == {gpu.node_id: "3", cpu.node_id: "0.000003"}

    removed = await client.delete(H100_PATH, headers=bearer(provider.key))
    assert removed.status_code == 204
    assert await node_prices(client, tenant) == {gpu.node_id: None, cpu.node_id: "0.000003"}
    again = await client.delete(H100_PATH, headers=bearer(provider.key))
    assert again.status_code == 404 and again.json()["error"]["code"] == "NOT_FOUND"


async def test_a_nodes_price_follows_its_inventory(
    client: httpx.AsyncClient,
    provider: ProviderHandle,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
) -> None:
    first = await sim_agent(gpu_node())
    await put_price(
        client, provider, H100_PATH, {"price_per_gpu_hour": "2", "spot_discount_pct": 30}
    )
    second = await sim_agent(gpu_node(hostname="second"))  # registered after: priced at once
    assert (await node_prices(client, tenant))[str(second.node_id)] == "2"
    await first.client.update_inventory(inventory(hostname="gpu-box"))  # its GPU is gone
    assert (await node_prices(client, tenant))[str(first.node_id)] is None
    await first.client.update_inventory(gpu_node())
    assert (await node_prices(client, tenant))[str(first.node_id)] == "2"


async def test_on_demand_rates_of_many_nodes_are_each_nodes_hourly_rate(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, sim_agent: AgentFactory
) -> None:
    l40s = H100.model_copy(update={"index": 1, "uuid": "GPU-l40s", "model": "NVIDIA L40S"})
    await sim_agent(gpu_node())
    await sim_agent(inventory(runtimes=GPU_RUNTIMES, gpus=[H100, l40s], hostname="mixed"))
    await sim_agent(inventory(hostname="cpu-only"))  # no price for "cpu": rate 0
    await put_price(
        client, provider, H100_PATH, {"price_per_gpu_hour": "2", "spot_discount_pct": 30}
    )
    l40s_path = f"/v1/provider/prices/{quote(l40s.model)}"
    await put_price(
        client, provider, l40s_path, {"price_per_gpu_hour": "3", "spot_discount_pct": 30}
    )
    other = await create_provider(client, "Other Farm")
    theirs = H100.model_copy(update={"uuid": "GPU-theirs"})
    their_node = SimulatedAgent(
        "http://testserver",
        transport=httpx.ASGITransport(app=app),
        node_inventory=inventory(runtimes=GPU_RUNTIMES, gpus=[theirs], hostname="theirs"),
    )
    await their_node.register(other.enrollment_token)
    await their_node.aclose()
    await put_price(client, other, H100_PATH, {"price_per_gpu_hour": "5", "spot_discount_pct": 30})
    async with app.state.replica.db.read() as session:
        rows = list((await session.scalars(select(NodeRow))).all())
        batched = prices.on_demand_rates(rows)
        one_by_one = {n.id: await prices.hourly_rate(session, n, spot=False) for n in rows}
        # what a claim and a submit take without a read is what the prices say
        read = {n.id: await prices.read_rate(session, n, spot=False) for n in rows}
    assert batched == one_by_one == read
    assert sorted(batched.values()) == [0, 2_000_000, 3_000_000, 5_000_000]


BAD_BODIES = [
    ({"price_per_gpu_hour": "-1", "spot_discount_pct": 40}, "price_per_gpu_hour"),
    ({"price_per_gpu_hour": "0", "spot_discount_pct": 40}, "price_per_gpu_hour"),
    ({"price_per_gpu_hour": "0.0000001", "spot_discount_pct": 40}, "price_per_gpu_hour"),
    ({"price_per_gpu_hour": "1000.000001", "spot_discount_pct": 40}, "price_per_gpu_hour"),
    ({"price_per_gpu_hour": "1e30", "spot_discount_pct": 40}, "price_per_gpu_hour"),
    ({"price_per_gpu_hour": "two", "spot_discount_pct": 40}, "price_per_gpu_hour"),
    ({"price_per_gpu_hour": "NaN", "spot_discount_pct": 40}, "price_per_gpu_hour"),
    ({"price_per_gpu_hour": 2.5, "spot_discount_pct": 40}, "price_per_gpu_hour"),  # a float
    ({"price_per_gpu_hour": None, "spot_discount_pct": 40}, "price_per_gpu_hour"),
    ({"spot_discount_pct": 40}, "price_per_gpu_hour"),
    ({"price_per_gpu_hour": "2", "spot_discount_pct": 29}, "spot_discount_pct"),
    ({"price_per_gpu_hour": "2", "spot_discount_pct": 71}, "spot_discount_pct"),
    ({"price_per_gpu_hour": "2", "spot_discount_pct": 40.5}, "spot_discount_pct"),
    ({"price_per_gpu_hour": "2"}, "spot_discount_pct"),
    *(
        ({"price_per_gpu_hour": a, "spot_discount_pct": 40}, "price_per_gpu_hour")
        for a in OFF_PATTERN
    ),
]


@pytest.mark.parametrize(("body", "field"), BAD_BODIES)
async def test_a_bad_price_is_refused_naming_the_field_and_changes_nothing(
    client: httpx.AsyncClient,
    provider: ProviderHandle,
    sim_agent: AgentFactory,
    body: dict[str, Any],
    field: str,
) -> None:
    await sim_agent(gpu_node())
    await put_price(
        client, provider, H100_PATH, {"price_per_gpu_hour": "2", "spot_discount_pct": 50}
    )
    answer = await put_price(client, provider, H100_PATH, body)
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["code"] == "VALIDATION_ERROR" and field in error["message"], error
    (price,) = (await my_prices(client, provider))["prices"]
    assert (price["price_per_gpu_hour"], price["spot_discount_pct"]) == ("2", 50)


async def test_a_model_the_provider_does_not_run_is_refused_saying_which_it_does(
    client: httpx.AsyncClient, provider: ProviderHandle, sim_agent: AgentFactory
) -> None:
    await sim_agent(gpu_node())
    answer = await put_price(
        client,
        provider,
        f"/v1/provider/prices/{quote('NVIDIA A100-SXM4-80GB')}",
        {"price_per_gpu_hour": "2", "spot_discount_pct": 50},
    )
    assert answer.status_code == 422
    message = answer.json()["error"]["message"]
    assert message.startswith("gpu_model:") and H100.model in message and '"cpu"' in message
    assert (await my_prices(client, provider))["prices"] == []


async def test_prices_are_for_their_provider_only(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, sim_agent: AgentFactory
) -> None:
    await sim_agent(gpu_node())
    body = {"price_per_gpu_hour": "2", "spot_discount_pct": 50}
    assert (await put_price(client, provider, H100_PATH, body)).status_code == 200

    other = await create_provider(client, "Other Farm")
    assert await my_prices(client, other) == {"prices": [], "unpriced_models": []}
    attempt = await put_price(client, other, H100_PATH, {**body, "price_per_gpu_hour": "9"})
    assert attempt.status_code == 422  # it runs no H100: nothing of the first one's is reachable
    removal = await client.delete(H100_PATH, headers=bearer(other.key))
    assert removal.status_code == 404
    (price,) = (await my_prices(client, provider))["prices"]
    assert price["price_per_gpu_hour"] == "2"

    tenant = await create_tenant(client, "Curious Tenant")
    for method in ("GET", "PUT", "DELETE"):
        path = "/v1/provider/prices" if method == "GET" else H100_PATH
        nobody = await client.request(method, path, json=body)
        assert nobody.status_code == 401, method
        as_tenant = await client.request(method, path, json=body, headers=tenant.headers)
        assert as_tenant.status_code == 403, method
        assert as_tenant.json()["error"]["code"] == "FORBIDDEN"
    assert (await client.get("/v1/provider/prices/recommendations")).status_code == 401
    (price,) = (await my_prices(client, provider))["prices"]
    assert price["price_per_gpu_hour"] == "2"


# ---- recommendations -----------------------------------------------------------------


def test_the_weighted_median_and_quartiles_are_offered_prices() -> None:
    points = [(1_000_000, 0.1), (3_000_000, 1.1), (4_000_000, 0.6)]
    assert weighted_quantile(points, 0.25) == 3_000_000
    assert weighted_quantile(points, 0.5) == 3_000_000
    assert weighted_quantile(points, 0.75) == 4_000_000
    assert weighted_quantile([(5, 1.0), (7, 1.0)], 0.5) == 5
    assert percentile_of(2_000_000, points) == 6  # 0.1 of 1.8 priced below
    assert percentile_of(3_000_000, points) == 36  # 0.1 below and half of 1.1 level
    assert percentile_of(9_000_000, points) == 100


async def _machine(
    app: FastAPI,
    client: httpx.AsyncClient,
    clock: FrozenClock,
    name: str,
    price: str,
    region: str | None,
    **node: Any,
) -> SimulatedAgent:
    """Another provider's H100 machine, a week old, priced."""
    owner = await create_provider(client, name)
    agent = SimulatedAgent(
        "http://testserver",
        transport=httpx.ASGITransport(app=app),
        node_inventory=inventory(
            runtimes=GPU_RUNTIMES, gpus=[H100], region=region, hostname=name, machine=name
        ),
    )
    await agent.register(owner.enrollment_token)
    await set_node(app, agent, registered_at=clock.now() - timedelta(days=8), **node)
    body = {"price_per_gpu_hour": price, "spot_discount_pct": 50}
    assert (await put_price(client, owner, H100_PATH, body)).status_code == 200
    return agent


async def _ran(
    app: FastAPI, tenant: TenantHandle, node_id: str | None, start: datetime, end: datetime
) -> None:
    async with app.state.replica.db.write() as session:
        session.add(
            InvokeRow(
                id=new_id("inv"),
                tenant_id=tenant.id,
                status="done",
                runtime="onnx_cuda",
                priority="normal",
                model_url="https://example.com/m.onnx",
                inputs_url="",
                timeout_sec=60,
                gpus=1,
                constraints={},
                warnings=[],
                attempts=1,
                max_attempts=3,
                node_id=node_id,
                created_at=start,
                started_at=start,
                finished_at=end,
                log_bytes=0,
            )
        )


async def recommendations(client: httpx.AsyncClient, provider: ProviderHandle) -> list[Any]:
    answer = await client.get("/v1/provider/prices/recommendations", headers=bearer(provider.key))
    assert answer.status_code == 200, answer.text
    listed: list[Any] = answer.json()
    return listed


async def test_recommendations_weigh_other_providers_prices_by_their_use(
    app: FastAPI,
    client: httpx.AsyncClient,
    clock: FrozenClock,
    provider: ProviderHandle,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
) -> None:
    now = clock.now()
    await sim_agent(gpu_node("eu-west", hostname="mine-eu"))
    await sim_agent(gpu_node("us-east", hostname="mine-us"))
    await put_price(
        client, provider, H100_PATH, {"price_per_gpu_hour": "2", "spot_discount_pct": 50}
    )
    await _machine(app, client, clock, "Idle Cheap", "1", "eu-west")
    busy = await _machine(app, client, clock, "Busy Mid", "3", "eu-west")
    half = await _machine(app, client, clock, "Half Dear", "4", "eu-west")
    await _machine(app, client, clock, "Far Away", "10", "ap-south")
    await _machine(app, client, clock, "Delisted", "0.5", "eu-west", delisted=True)
    await _machine(
        app, client, clock, "Gone", "0.5", "eu-west", last_seen_at=now - timedelta(days=8)
    )
    await _ran(app, tenant, busy.node_id, now - timedelta(days=9), now)  # all week: 1.0
    await _ran(app, tenant, half.node_id, now - timedelta(days=3, hours=12), now)  # 0.5

    eu, us = await recommendations(client, provider)
    assert (eu["region"], eu["compared_in"], eu["comparable_offers"]) == ("eu-west", "region", 3)
    assert eu["suggested_price_per_gpu_hour"] == "3"  # weights 0.1, 1.1, 0.6
    assert (eu["range_low"], eu["range_high"]) == ("3", "4")
    assert eu["your_price_per_gpu_hour"] == "2" and eu["your_percentile"] == 6
    assert eu["market_utilization"] == 0.5 and eu["window_days"] == 7
    assert "3 priced machines of other providers in eu-west," in eu["basis"]

    # One offer in the region is too few: every region is compared.
    assert (us["region"], us["compared_in"], us["comparable_offers"]) == (
        "us-east",
        "all_regions",
        4,
    )
    assert us["suggested_price_per_gpu_hour"] == "3" and us["range_high"] == "4"
    assert "across all regions" in us["basis"]


async def test_with_nothing_to_compare_there_is_no_recommendation_and_it_says_so(
    app: FastAPI,
    client: httpx.AsyncClient,
    clock: FrozenClock,
    provider: ProviderHandle,
    sim_agent: AgentFactory,
) -> None:
    assert await recommendations(client, provider) == []  # no machines, nothing to price
    await sim_agent()  # a CPU node; nobody else prices CPU nodes
    await _machine(app, client, clock, "Only GPUs", "2", None)
    (cpu,) = await recommendations(client, provider)
    assert cpu["gpu_model"] == "cpu" and cpu["comparable_offers"] == 0
    for figure in ("suggested_price_per_gpu_hour", "range_low", "range_high", "your_percentile"):
        assert cpu[figure] is None
    assert "no recommendation" in cpu["basis"]


async def test_odd_input_never_answers_500(
    client: httpx.AsyncClient, provider: ProviderHandle, sim_agent: AgentFactory
) -> None:
    await sim_agent(gpu_node())
    good = {"price_per_gpu_hour": "2", "spot_discount_pct": 50}
    paths = ["%00", quote("é" * 200), "x" * 201, quote("NVIDIA H100\u0000"), "%20", "cpu%2F..%2F"]
    bodies: list[Any] = [
        {"price_per_gpu_hour": "Infinity", "spot_discount_pct": 50},
        {"price_per_gpu_hour": {"a": 1}, "spot_discount_pct": 50},
        {"price_per_gpu_hour": True, "spot_discount_pct": 50},
        {"price_per_gpu_hour": "2", "spot_discount_pct": 10**30},
        [],
        "2",
    ]
    for path in paths:
        for method in ("PUT", "DELETE"):
            answer = await client.request(
                method, f"/v1/provider/prices/{path}", json=good, headers=bearer(provider.key)
            )
            assert 400 <= answer.status_code < 500, (path, answer.status_code)
    for body in bodies:
        answer = await put_price(client, provider, H100_PATH, body)
        assert answer.status_code == 422, (body, answer.text)
    assert (await my_prices(client, provider))["prices"] == []
