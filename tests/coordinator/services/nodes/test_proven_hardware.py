"""Proven hardware in placement (docs/trust.md; SPEC §3.8): a GPU is rented as its model only
once a hardware challenge proved it. A passed challenge is stood for by writing the node's
`verification` as the challenges do (`testing/verification.py`); the challenges themselves
are tests/coordinator/services/trust's."""

from datetime import timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import func, select

from gpu_share.coordinator.core.orm import (
    InvokeRow,
    NodeRow,
    ProviderPriceRow,
    ProviderRow,
    ReservationRow,
)
from gpu_share.coordinator.core.statuses import CheckState
from gpu_share.coordinator.services.nodes import placement, ranking
from gpu_share.protocol.nodes import GpuInfo
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import HELLO_WORLD, ProviderHandle, TenantHandle
from gpu_share.testing.rentals import Rentals, gpus
from gpu_share.testing.simulated_agent import H100, AgentFactory, SimulatedAgent, inventory
from gpu_share.testing.verification import mark_unverified, mark_verified, proofs_for
from tests.coordinator.services.nodes.test_placement import set_node
from tests.coordinator.services.providers.test_benchmarks import measured_like, report
from tests.coordinator.services.sessions.test_gpus import AgentChannel
from tests.coordinator.services.work.test_leases import CPU_HELLO

GPU_JOB = {**HELLO_WORLD, "timeout_sec": 60}


async def offered(client: httpx.AsyncClient, tenant: TenantHandle, **params: Any) -> list[Any]:
    answer = await client.get("/v1/offers", params=params, headers=tenant.headers)
    assert answer.status_code == 200, answer.text
    found: list[Any] = answer.json()
    return found


async def invoke(client: httpx.AsyncClient, tenant: TenantHandle, **body: Any) -> httpx.Response:
    return await client.post("/v1/gpu/invoke", json={**GPU_JOB, **body}, headers=tenant.headers)


def refused_for(answer: httpx.Response, status: int, constraint: str) -> None:
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["details"]["constraint"] == constraint


async def count(app: FastAPI, row: Any) -> int:
    async with app.state.replica.db.read() as session:
        return int(await session.scalar(select(func.count()).select_from(row)) or 0)


async def test_a_cpu_box_claiming_an_h100_is_not_offered_reserved_or_placed_until_proven(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    rentals: Rentals,
) -> None:
    """The attack as seen: an inventory naming an H100, benchmark figures at 0.95× its
    datasheet, a price. Nothing but a passed challenge makes it rentable as an H100."""
    liar = await rentals.node(count=1, verified=False)
    card = liar.inventory.gpus[0]
    assert card.model == H100.model  # "NVIDIA H100 80GB HBM3", NVML's name for it
    posted = await liar.client.report_benchmark(report(measured_like(card, "h100-80gb", 0.95)))
    assert posted.passed is True  # the figures alone would list it
    await rentals.top_up(tenant, "100")
    before = await rentals.balances(tenant)

    assert liar.node_id not in [o["node_id"] for o in await offered(client, tenant)]
    assert await offered(client, tenant, gpu_model="H100") == []
    [shown] = await offered(client, tenant, include_unverified="true")
    assert shown["node_id"] == liar.node_id and shown["verified"] is False
    assert shown["verified_at"] is None
    assert [g["verified"] for g in shown["gpus"]] == [False]

    named = await rentals.reserve(tenant, node_id=liar.node_id, hours=1)
    refused_for(named, 422, "verified")
    assert "hardware challenge" in named.json()["error"]["message"]
    refused_for(await rentals.reserve(tenant, gpu_model="H100", hours=1), 503, "verified")
    refused_for(
        await rentals.reserve(tenant, node_id=liar.node_id, hours=1, require_verified=False),
        422,
        "verified",
    )
    assert await rentals.balances(tenant) == before  # nothing charged, nothing held
    assert await count(app, ReservationRow) == 0

    for named_hardware in ({"gpu_model": "H100"}, {"min_vram_gb": 40}):
        refused = await invoke(client, tenant, **named_hardware)
        refused_for(refused, 503, "verified")
        assert refused.json()["error"]["code"] == "NO_CAPACITY"
        assert "hardware challenge" in refused.json()["error"]["message"]
    assert await rentals.balances(tenant) == before

    await mark_verified(app.state.replica, liar.node_id or "")  # its challenge passed
    [listed] = await offered(client, tenant)
    assert listed["node_id"] == liar.node_id and listed["verified"] is True
    assert listed["verified_at"] is not None and listed["gpus"][0]["verified"] is True
    placed = await invoke(client, tenant, gpu_model="H100", min_vram_gb=40)
    assert placed.status_code == 202, placed.text
    [job] = await liar.lease()
    assert job.invoke_id == placed.json()["id"]
    booked = await rentals.reserve(tenant, node_id=liar.node_id, hours=1)
    assert booked.status_code == 201, booked.text


async def test_a_queued_job_naming_a_model_stays_off_an_unverified_node(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, rentals: Rentals
) -> None:
    """The claim holds the rule too: the job was accepted (a proven H100 is online), and the
    unverified node polling first is not given it; the proven one is."""
    proven = await rentals.node(count=1)
    liar = await rentals.node(count=1, verified=False)
    await rentals.top_up(tenant, "100")
    queued = await invoke(client, tenant, gpu_model="H100")
    assert queued.status_code == 202, queued.text
    assert await liar.lease() == []
    [job] = await proven.lease()
    assert job.invoke_id == queued.json()["id"]


async def test_unnamed_gpu_work_may_still_run_on_unverified_gpus(
    client: httpx.AsyncClient, tenant: TenantHandle, rentals: Rentals
) -> None:
    unproven = await rentals.node(count=1, verified=False)
    await rentals.top_up(tenant, "100")
    queued = await invoke(client, tenant)  # onnx_cuda, no model or memory named
    assert queued.status_code == 202, queued.text
    [job] = await unproven.lease()
    assert job.invoke_id == queued.json()["id"]


async def test_require_verified_invokes_run_only_on_verified_nodes(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    unproven = await sim_agent()  # a CPU node whose cores no challenge proved yet
    refused = await client.post(
        "/v1/gpu/invoke", json={**CPU_HELLO, "require_verified": True}, headers=tenant.headers
    )
    refused_for(refused, 503, "verified")
    assert "require_verified" in refused.json()["error"]["message"]

    proven = await sim_agent(verified=True)
    queued = await client.post(
        "/v1/gpu/invoke", json={**CPU_HELLO, "require_verified": True}, headers=tenant.headers
    )
    assert queued.status_code == 202, queued.text
    async with app.state.replica.db.read() as session:
        row = await session.get(InvokeRow, queued.json()["id"])
        assert row is not None and row.constraints["require_verified"] is True
    assert await unproven.lease() == []
    [job] = await proven.lease()
    assert job.invoke_id == queued.json()["id"]

    plain = await client.post("/v1/gpu/invoke", json=CPU_HELLO, headers=tenant.headers)
    [job] = await unproven.lease()  # without require_verified, any node serves it
    assert job.invoke_id == plain.json()["id"]


async def test_a_cpu_node_proves_at_least_the_cores_it_advertises(
    app: FastAPI, sim_agent: AgentFactory, clock: FrozenClock
) -> None:
    agent = await sim_agent()
    async with app.state.replica.db.write() as session:
        node = await session.get(NodeRow, agent.node_id)
        assert node is not None and not node.gpus
        at = clock.now().isoformat()
        node.verification = {"cpu": {"cores": node.cpu_count - 1, "verified_at": at}}
        assert not placement.node_verified(node)
        node.verification = {"cpu": {"cores": node.cpu_count, "verified_at": at}}
        assert placement.node_verified(node)
        assert placement.verified_at(node) == clock.now()


async def test_a_proof_counts_only_for_the_model_the_gpu_claims_now(
    app: FastAPI, sim_agent: AgentFactory, clock: FrozenClock
) -> None:
    """A proof names the catalog model its challenge held the GPU to: renamed, or a card the
    catalog does not know, the GPU is not verified."""
    agent = await sim_agent(inventory(gpus=gpus(2)), verified=True)
    async with app.state.replica.db.write() as session:
        node = await session.get(NodeRow, agent.node_id)
        assert node is not None
        assert [placement.gpu_verified(node, g) for g in node.gpus] == [True, True]
        assert placement.node_verified(node)
        node.verification = {
            **proofs_for(node, clock.now()),
            node.gpus[1]["uuid"]: {"model": "NVIDIA A100 80GB", "verified_at": "x"},
        }
        assert [placement.gpu_verified(node, g) for g in node.gpus] == [True, False]
        assert not placement.node_verified(node) and placement.verified_at(node) is None
        odd = {**node.gpus[0], "model": "NVIDIA Quadro Odd"}
        assert not placement.gpu_verified(node, odd)


async def test_reservations_take_only_verified_gpus(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, rentals: Rentals
) -> None:
    """Half proven: not a verified node, so refused by default; without require_verified
    the proven GPU alone may be reserved, never the other."""
    node = await rentals.node(count=2)
    async with app.state.replica.db.write() as session:
        row = await session.get(NodeRow, node.node_id)
        assert row is not None
        unproven = row.gpus[0]["uuid"]
        row.verification = {k: v for k, v in (row.verification or {}).items() if k != unproven}
    await rentals.top_up(tenant, "100")
    refused_for(await rentals.reserve(tenant, node_id=node.node_id, hours=1), 422, "verified")
    two = await rentals.reserve(
        tenant, node_id=node.node_id, hours=1, gpus=2, require_verified=False
    )
    refused_for(two, 422, "verified")
    one = await rentals.book(tenant, node, hours=1, require_verified=False)
    assert one["gpu_indices"] == [1]


async def test_require_verified_sessions_go_only_to_verified_nodes(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, rentals: Rentals
) -> None:
    unproven = await rentals.node(count=1, verified=False)
    hub = app.state.replica.hub
    hub.attach(unproven.node_id, AgentChannel(app))
    await rentals.top_up(tenant, "100")
    body = {"runtime": "onnx_cuda", "model_url": HELLO_WORLD["model_url"], "require_verified": True}
    refused = await client.post("/v1/gpu/sessions", json=body, headers=tenant.headers)
    refused_for(refused, 503, "verified")
    named = await client.post(
        "/v1/gpu/sessions",
        json={**body, "require_verified": False, "gpu_model": "H100"},
        headers=tenant.headers,
    )
    refused_for(named, 503, "verified")

    proven = await rentals.node(count=1)
    hub.attach(proven.node_id, AgentChannel(app))
    made = await client.post("/v1/gpu/sessions", json=body, headers=tenant.headers)
    assert made.status_code == 201, made.text
    assert made.json()["node_id"] == proven.node_id


async def barred(
    client: httpx.AsyncClient, tenant: TenantHandle, agent: SimulatedAgent, constraint: str
) -> None:
    """In no offer, not listed, given no work, and new work refused naming `constraint`."""
    assert await offered(client, tenant, include_unverified="true") == []
    nodes = (await client.get("/v1/nodes", headers=tenant.headers)).json()
    assert agent.node_id not in [n["id"] for n in nodes]
    assert await agent.lease() == []
    refused = await client.post("/v1/gpu/invoke", json=CPU_HELLO, headers=tenant.headers)
    refused_for(refused, 503, constraint)


async def test_a_quarantined_node_or_a_suspended_providers_is_not_listed_offered_or_placed(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    provider: ProviderHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
) -> None:
    agent = await sim_agent(verified=True)
    queued = await client.post("/v1/gpu/invoke", json=CPU_HELLO, headers=tenant.headers)
    assert queued.status_code == 202, queued.text

    await set_node(app, agent, quarantined_at=clock.now(), quarantine_reason="wrong results")
    await barred(client, tenant, agent, "listed")

    await set_node(app, agent, quarantined_at=None)
    async with app.state.replica.db.write() as session:
        owner = await session.get(ProviderRow, provider.id)
        assert owner is not None
        owner.suspended_at = clock.now()
    await barred(client, tenant, agent, "online")  # not even counted online

    async with app.state.replica.db.write() as session:
        owner = await session.get(ProviderRow, provider.id)
        assert owner is not None
        owner.suspended_at = None
    [job] = await agent.lease()  # the same node, cleared: the queued job was waiting
    assert job.invoke_id == queued.json()["id"]


async def test_the_enterprise_bonus_counts_only_for_proven_hardware(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, sim_agent: AgentFactory
) -> None:
    agent = await sim_agent()
    await set_node(app, agent, tier="enterprise")
    [offer] = await offered(client, tenant, include_unverified="true")
    assert offer["rank_components"]["enterprise"] == 0.0
    await mark_verified(app.state.replica, agent.node_id or "")
    [offer] = await offered(client, tenant)
    assert offer["rank_components"]["enterprise"] == 1.0
    assert offer["rank"] == pytest.approx(
        sum(ranking.WEIGHTS[k] * v for k, v in offer["rank_components"].items()), abs=1e-6
    )
    await mark_unverified(app.state.replica, agent.node_id or "")
    [offer] = await offered(client, tenant, include_unverified="true")
    assert offer["rank_components"]["enterprise"] == 0.0


async def test_nodes_and_offers_say_when_they_were_verified_and_how_often_checked(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
) -> None:
    proven_at = clock.now()
    agent = await sim_agent(
        inventory(runtimes=[RuntimeName.ONNX_CUDA, RuntimeName.ONNX_CPU], gpus=gpus(2)),
        verified=True,
    )
    clock.advance(5)  # proven a moment ago, still online
    await set_node(app, agent, spot_checks={"rate": 0.25, "matches": 12})
    [node] = (await client.get("/v1/nodes", headers=tenant.headers)).json()
    assert node["verified"] is True and node["spot_check_rate"] == 0.25
    assert node["verified_at"].startswith(proven_at.isoformat()[:19])
    assert [g["verified"] for g in node["gpus"]] == [True, True]
    [offer] = await offered(client, tenant)
    assert (offer["verified"], offer["spot_check_rate"]) == (True, 0.25)

    other = await sim_agent()
    nodes = {n["id"]: n for n in (await client.get("/v1/nodes", headers=tenant.headers)).json()}
    assert nodes[other.node_id]["verified"] is False  # every node is listed, with its flags
    assert nodes[other.node_id]["verified_at"] is None
    assert nodes[other.node_id]["spot_check_rate"] is None


@pytest.mark.parametrize(
    ("state", "refunded", "checked"),
    [
        (None, False, False),
        (CheckState.SKIPPED, False, False),  # not picked for a check
        (CheckState.PENDING, False, False),
        (CheckState.CONFIRMING, False, False),
        (CheckState.INCONCLUSIVE, False, False),
        (CheckState.MATCH, False, True),
        (CheckState.MISMATCH, True, True),
    ],
)
async def test_an_invoke_says_whether_it_was_spot_checked_and_why_it_was_refunded(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
    state: CheckState | None,
    refunded: bool,
    checked: bool,
) -> None:
    await sim_agent()
    queued = await client.post("/v1/gpu/invoke", json=CPU_HELLO, headers=tenant.headers)
    invoke_id = queued.json()["id"]
    async with app.state.replica.db.write() as session:
        row = await session.get(InvokeRow, invoke_id)
        assert row is not None
        row.check_state = state.value if state else None
        if refunded:
            row.refunded_at = clock.now() + timedelta(minutes=5)
            row.refund_reason = "its node was caught returning wrong results"
    shown = (await client.get(f"/v1/gpu/invokes/{invoke_id}", headers=tenant.headers)).json()
    assert shown["spot_checked"] is checked
    if refunded:
        assert shown["refund"]["reason"] == "its node was caught returning wrong results"
        assert shown["refund"]["at"] is not None
    else:
        assert shown["refund"] is None


def test_verification_is_read_from_the_row_alone() -> None:
    """The rule is pure: a row with a proof and nothing else loaded is judged the same."""
    node = NodeRow(
        id="nod_x",
        gpus=[{"uuid": "GPU-a", "model": "NVIDIA L4", "vram_mb": 23034, "cuda_version": "12.4"}],
        cpu_count=8,
        verification={
            "GPU-a": {"model": "NVIDIA L4 24GB", "verified_at": "2026-01-01T00:00:00+00:00"}
        },
    )
    assert placement.node_verified(node)
    req = placement.Requirements(runtime=RuntimeName.ONNX_CUDA, gpu_model="L4")
    assert req.verified_gpus_only and placement.matching_gpus(node, req) == 1
    node.verification = None
    assert placement.matching_gpus(node, req) == 0
    assert placement.matching_gpus(node, placement.Requirements(runtime=RuntimeName.ONNX_CUDA)) == 1
    unchecked = placement.Requirements(
        runtime=RuntimeName.ONNX_CUDA, gpu_model="L4", verified_gpus=False
    )
    assert placement.matching_gpus(node, unchecked) == 1


async def test_quotes_and_the_reserve_count_only_the_nodes_the_rule_lets_run_the_work(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, rentals: Rentals
) -> None:
    """What an invoke holds from the balance is its timeout at the highest rate of the nodes
    that may run it: a dear unverified card claiming to be an H100 is not one of them for
    work naming an H100, nor for `require_verified` work."""
    proven = await rentals.node(count=1)  # an H100 at 2 USDC per GPU-hour
    pcie = GpuInfo(
        index=0, uuid="GPU-pcie-0001", model="NVIDIA H100 PCIe", vram_mb=81559, cuda_version="12.4"
    )
    liar = await rentals.sim_agent(inventory(runtimes=[RuntimeName.ONNX_CUDA], gpus=[pcie]))
    async with app.state.replica.db.write() as session:
        session.add(
            ProviderPriceRow(
                provider_id=rentals.provider.id,
                gpu_model=pcie.model,
                price_micro_per_hour=10_000_000,
                spot_discount_bps=5000,
                updated_at=app.state.replica.clock.now(),
            )
        )
        node = await session.get(NodeRow, liar.node_id)
        assert node is not None
        node.price_per_gpu_hour_micro = 10_000_000
    await rentals.top_up(tenant, "100")
    hour = {**GPU_JOB, "timeout_sec": 3600}

    async def quote(**body: Any) -> dict[str, Any]:
        answer = await client.post("/v1/gpu/quote", json={**hour, **body}, headers=tenant.headers)
        assert answer.status_code == 200, answer.text
        quoted: dict[str, Any] = answer.json()
        return quoted

    assert (await quote())["reserve"] == "10"  # unnamed work may run on either
    for rule in ({"gpu_model": "H100"}, {"require_verified": True}):
        quoted = await quote(**rule)
        assert (quoted["node_id"], quoted["reserve"]) == (proven.node_id, "2"), rule
    made = await invoke(client, tenant, **{**hour, "gpu_model": "H100"})
    assert made.status_code == 202, made.text
    assert await rentals.balances(tenant) == (98_000_000, 2_000_000)
