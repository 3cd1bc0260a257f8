"""Benchmarks on the coordinator (SPEC §3.3): a run is scored against its GPUs' datasheet
figures and its tier's thresholds; a GPU that fails is delisted and its provider mailed,
a later passing run relists it; admins ask for runs; bad reports are refused."""

import json
import math
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.nodes import gpu_catalog
from gpu_share.coordinator.services.providers import benchmarks
from gpu_share.protocol import benchmarks as wire
from gpu_share.protocol.nodes import GpuInfo, Tier
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import ADMIN, TEST_ADMIN_KEY, ProviderHandle, create_provider
from gpu_share.testing.simulated_agent import (
    H100,
    AgentFactory,
    SimulatedAgent,
    inventory,
    own_gpus,
)
from tests.web.admin.test_pages import csrf_of, signed_in

L4_CARD = GpuInfo(index=1, uuid="GPU-l4-0001", model="NVIDIA L4", vram_mb=23034)
UNKNOWN_CARD = GpuInfo(index=0, uuid="GPU-odd-0001", model="NVIDIA Quadro Odd", vram_mb=8192)


def measured_like(gpu: GpuInfo, model_id: str, efficiency: float = 0.8) -> wire.GpuMeasurement:
    """`gpu` reporting figures at `efficiency` of `model_id`'s datasheet."""
    model = gpu_catalog.REFERENCES[model_id]
    return wire.GpuMeasurement(
        index=gpu.index,
        uuid=gpu.uuid,
        model=gpu.model,
        backend="simulated",
        fp32_tflops=model.fp32_tflops * efficiency,
        fp16_tflops=model.fp16_tflops * efficiency,
        bf16_tflops=model.bf16_tflops * efficiency,
        tf32_tflops=model.tf32_tflops * efficiency,
        memory_bandwidth_gbs=model.memory_bandwidth_gbs * efficiency,
    )


def report(
    *gpus: wire.GpuMeasurement,
    trigger: wire.BenchmarkTrigger = wire.BenchmarkTrigger.PERIODIC,
    cpu: wire.CpuMeasurement | None = None,
    duration_ms: int = 12_000,
) -> wire.BenchmarkReport:
    return wire.BenchmarkReport(
        trigger=trigger,
        started_at=datetime.now(UTC),
        duration_ms=duration_ms,
        gpus=list(gpus),
        cpu=cpu or wire.CpuMeasurement(cores=4, matmul_gflops=300.0, memory_bandwidth_gbs=12.0),
        network=wire.NetworkMeasurement(rtt_ms=2.0, download_mbps=900.0, upload_mbps=800.0),
        storage=wire.StorageMeasurement(write_mbps=400.0, read_mbps=1500.0),
    )


async def mails(client: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    answer = await client.get("/v1/admin/outbox", headers=ADMIN)
    assert answer.status_code == 200, answer.text
    return {mail["cause"]: mail for mail in answer.json()}


async def listed(client: httpx.AsyncClient, tenant_headers: dict[str, str]) -> list[bool]:
    nodes = (await client.get("/v1/nodes", headers=tenant_headers)).json()
    return [gpu["listed"] for node in nodes for gpu in node["gpus"]]


async def state_of(app: FastAPI, node_id: str) -> dict[str, Any]:
    replica: Replica = app.state.replica
    async with replica.db.read() as session:
        node = await session.get(NodeRow, node_id)
        assert node is not None
        return dict(node.benchmark_state or {})


async def test_an_h100_that_measures_like_an_l4_is_delisted_mailed_and_relisted_by_a_good_run(
    app: FastAPI, client: httpx.AsyncClient, sim_agent: AgentFactory, tenant: Any
) -> None:
    agent = await sim_agent(inventory(gpus=[H100]))
    assert await listed(client, tenant.headers) == [True]

    bad = await agent.client.report_benchmark(report(measured_like(H100, "l4-24gb")))
    assert bad.passed is False
    verdict = bad.gpus[0]
    assert verdict.reference_model == "h100-80gb" and verdict.performs_like == "l4-24gb"
    assert verdict.passed is False and verdict.score is not None and verdict.score < 0.2
    assert "measures like an NVIDIA L4 24GB, not the NVIDIA H100 80GB" in (verdict.reason or "")
    fp16 = verdict.components["fp16"]
    assert fp16.reference == 989.4 and fp16.unit == "TFLOP/s"
    assert fp16.score == pytest.approx(121.0 * 0.8 / 989.4, abs=1e-4)
    assert await listed(client, tenant.headers) == [False]
    state = await state_of(app, bad.node_id)
    entry = state["gpus"][H100.uuid]
    assert entry["passed"] is False and entry["score"] == verdict.score
    assert set(entry) == {"score", "passed", "reason", "components", "at"}
    assert state["node"]["passed"] is True  # a GPU node is judged per GPU

    outbox = await mails(client)
    delisted = outbox[f"{bad.id}:delisted:{H100.uuid}"]
    assert delisted["to"] == "gpu.farm@example.com"
    assert "sim-node" in delisted["subject"] and "delisted" in delisted["subject"]
    assert (
        "FP16 matmul: 96.8 TFLOP/s is 10% of the NVIDIA H100 80GB's 989.4 TFLOP/s"
        in (delisted["body"])
    )
    assert "/provider/benchmarks" in delisted["body"]

    again = await agent.client.report_benchmark(report(measured_like(H100, "l4-24gb")))
    assert again.passed is False
    assert not any(cause.startswith(again.id) for cause in await mails(client))  # once

    good = await agent.client.report_benchmark(report(measured_like(H100, "h100-80gb")))
    assert good.passed is True and good.gpus[0].score == pytest.approx(0.8)
    assert good.gpus[0].performs_like is None and good.reason is None
    assert await listed(client, tenant.headers) == [True]
    relisted = (await mails(client))[f"{good.id}:relisted:{H100.uuid}"]
    assert "listed again" in relisted["subject"] and "0.80" in relisted["body"]


async def test_enterprise_thresholds_are_stricter_than_community(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    verdicts, taken = {}, set[str]()
    for tier in Tier:
        created = await client.post(
            "/v1/admin/providers",
            json={"name": f"{tier.value} farm", "email": f"{tier.value}@example.com", "tier": tier},
            headers=ADMIN,
        )
        agent = SimulatedAgent(
            "http://testserver",
            transport=httpx.ASGITransport(app=app),
            node_inventory=own_gpus(inventory(gpus=[H100]), taken),  # a machine each
        )
        await agent.register(created.json()["enrollment_token"])
        throttled = measured_like(agent.inventory.gpus[0], "h100-80gb", efficiency=0.55)
        verdicts[tier] = await agent.client.report_benchmark(report(throttled))
        await agent.aclose()
    enterprise, community = verdicts[Tier.ENTERPRISE], verdicts[Tier.COMMUNITY]
    assert community.passed is True and community.tier == "community"
    assert enterprise.passed is False and enterprise.tier == "enterprise"
    assert "score 0.55 against the NVIDIA H100 80GB's figures is below Enterprise's 0.60" in (
        enterprise.reason or ""
    )
    assert enterprise.gpus[0].performs_like is None  # slow, but an H100


async def test_a_gpu_model_without_reference_figures_is_shown_unscored_and_stays_listed(
    app: FastAPI, client: httpx.AsyncClient, sim_agent: AgentFactory, tenant: Any
) -> None:
    agent = await sim_agent(inventory(gpus=[UNKNOWN_CARD]))
    odd = measured_like(UNKNOWN_CARD, "l4-24gb", efficiency=0.1)
    run = await agent.client.report_benchmark(report(odd))
    verdict = run.gpus[0]
    assert verdict.score is None and verdict.passed is None and run.passed is True
    assert verdict.reason == "no reference figures for NVIDIA Quadro Odd: shown, not scored"
    assert verdict.components["fp32"].reference is None
    assert await listed(client, tenant.headers) == [True]
    assert (await state_of(app, run.node_id))["gpus"] == {}


async def test_a_gpu_that_could_not_be_measured_keeps_its_last_verdict(
    app: FastAPI, sim_agent: AgentFactory
) -> None:
    agent = await sim_agent(inventory(gpus=[H100]))
    await agent.client.report_benchmark(report(measured_like(H100, "l4-24gb")))
    unmeasured = wire.GpuMeasurement(
        index=0, uuid=H100.uuid, model=H100.model, error="neither PyTorch nor CuPy is installed"
    )
    run = await agent.client.report_benchmark(report(unmeasured))
    assert run.gpus[0].reason == "not measured: neither PyTorch nor CuPy is installed"
    state = await state_of(app, run.node_id)
    assert state["gpus"][H100.uuid]["passed"] is False  # still delisted: only a pass relists


async def test_a_cpu_node_is_scored_per_core_against_the_baseline_and_delisted_below_it(
    client: httpx.AsyncClient, sim_agent: AgentFactory, tenant: Any
) -> None:
    agent = await sim_agent()  # no GPU
    fine = wire.CpuMeasurement(cores=8, matmul_gflops=8 * 64 * 0.9, memory_bandwidth_gbs=9.0)
    run = await agent.client.report_benchmark(report(cpu=fine))
    assert run.passed is True and run.gpus == []
    assert run.node.score == pytest.approx(0.9)
    matmul = run.node.components["cpu_matmul"]
    assert (matmul.reference, matmul.unit, matmul.counts) == (8 * 64.0, "GFLOP/s", True)
    assert run.node.components["network_rtt"].counts is False
    assert run.node.components["storage_write"].measured == 400.0

    slow = wire.CpuMeasurement(cores=8, matmul_gflops=8 * 64 * 0.1, memory_bandwidth_gbs=1.0)
    failed = await agent.client.report_benchmark(report(cpu=slow))
    assert failed.passed is False and failed.node.passed is False
    assert "below Community's 0.30" in (failed.node.reason or "")
    nodes = (await client.get("/v1/nodes", headers=tenant.headers)).json()
    assert [node["status"] for node in nodes] == ["delisted"]
    assert f"{failed.id}:delisted:node" in await mails(client)
    back = await agent.client.report_benchmark(report(cpu=fine))
    assert f"{back.id}:relisted:node" in await mails(client)
    nodes = (await client.get("/v1/nodes", headers=tenant.headers)).json()
    assert [node["status"] for node in nodes] == ["online"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("fp16_tflops", -1.0),
        ("fp16_tflops", math.nan),
        ("fp32_tflops", math.inf),
        ("memory_bandwidth_gbs", 1e12),
        ("fp16_tflops", "fast"),
    ],
)
async def test_bad_figures_are_refused_with_422_and_record_nothing(
    app: FastAPI, client: httpx.AsyncClient, sim_agent: AgentFactory, field: str, value: Any
) -> None:
    agent = await sim_agent(inventory(gpus=[H100]))
    body = report(measured_like(H100, "h100-80gb")).model_dump(mode="json")
    body["gpus"][0][field] = value
    answer = await client.post(
        "/v1/agent/benchmarks",
        content=json.dumps(body),  # json.dumps writes NaN and Infinity as JavaScript does
        headers={"Authorization": f"Bearer {agent.client.key}", "Content-Type": "application/json"},
    )
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["code"] == "VALIDATION_ERROR"
    assert await state_of(app, agent.node_id or "") == {}


@pytest.mark.parametrize(
    "change",
    [
        {"duration_ms": -5},
        {"started_at": "2026-01-01T00:00:00"},  # no time zone
        {"network": {"rtt_ms": -1}},
        {"storage": {"write_mbps": 1e30}},
        {"cpu": {"cores": 0}},
        {"errors": ["x" * 5000]},
        {"trigger": "whenever"},
    ],
)
async def test_bad_reports_are_refused_with_422(
    client: httpx.AsyncClient, sim_agent: AgentFactory, change: dict[str, Any]
) -> None:
    agent = await sim_agent()
    body = {**report().model_dump(mode="json"), **change}
    answer = await client.post(
        "/v1/agent/benchmarks",
        json=body,
        headers={"Authorization": f"Bearer {agent.client.key}"},
    )
    assert answer.status_code == 422, answer.text


async def test_a_gpu_the_node_does_not_have_or_twice_is_refused(
    client: httpx.AsyncClient, sim_agent: AgentFactory
) -> None:
    agent = await sim_agent(inventory(gpus=[H100]))
    headers = {"Authorization": f"Bearer {agent.client.key}"}
    stranger = report(measured_like(L4_CARD, "l4-24gb")).model_dump(mode="json")
    answer = await client.post("/v1/agent/benchmarks", json=stranger, headers=headers)
    assert answer.status_code == 422
    assert "not in this node's inventory" in answer.json()["error"]["message"]
    twice = report(measured_like(H100, "h100-80gb")).model_dump(mode="json")
    twice["gpus"] = twice["gpus"] * 2
    answer = await client.post("/v1/agent/benchmarks", json=twice, headers=headers)
    assert answer.status_code == 422


async def test_an_admin_request_sets_the_flag_the_heartbeat_says_run_and_a_run_settles_it(
    client: httpx.AsyncClient, sim_agent: AgentFactory, clock: FrozenClock
) -> None:
    agent = await sim_agent()
    assert (await agent.heartbeat()).run_benchmark is False
    asked = await client.post(f"/v1/admin/nodes/{agent.node_id}/benchmark", headers=ADMIN)
    assert asked.status_code == 202, asked.text
    assert asked.json()["node_id"] == agent.node_id
    assert (await agent.heartbeat()).run_benchmark is True

    # A periodic run that started before the request does not answer it...
    await agent.client.report_benchmark(report(duration_ms=5_000))
    assert (await agent.heartbeat()).run_benchmark is True
    # ...the requested one does.
    clock.advance(30)
    await agent.client.report_benchmark(report(trigger=wire.BenchmarkTrigger.REQUESTED))
    assert (await agent.heartbeat()).run_benchmark is False


async def test_admin_requests_need_an_admin_and_a_node(
    client: httpx.AsyncClient, sim_agent: AgentFactory, provider: ProviderHandle
) -> None:
    agent = await sim_agent()
    path = f"/v1/admin/nodes/{agent.node_id}/benchmark"
    mine = {"Authorization": f"Bearer {provider.key}"}
    assert (await client.post(path, headers=mine)).status_code == 403
    missing = "/v1/admin/nodes/nod_0000000000000000000000000a/benchmark"
    assert (await client.post(missing, headers=ADMIN)).status_code == 404
    assert (await client.post("/v1/admin/nodes/nope/benchmark", headers=ADMIN)).status_code == 422


async def test_providers_read_their_own_nodes_history_and_tenants_the_latest_run(
    client: httpx.AsyncClient, sim_agent: AgentFactory, provider: ProviderHandle, tenant: Any
) -> None:
    agent = await sim_agent(inventory(gpus=[H100]))
    node_id = agent.node_id
    tenant_view = await client.get(f"/v1/nodes/{node_id}/benchmarks", headers=tenant.headers)
    assert tenant_view.json() == {"node_id": node_id, "latest": None}

    first = await agent.client.report_benchmark(report(measured_like(H100, "l4-24gb")))
    bench = report(measured_like(H100, "h100-80gb"))
    bench.errors = ["storage: a note only the provider sees"]
    second = await agent.client.report_benchmark(bench)

    mine = {"Authorization": f"Bearer {provider.key}"}
    history = await client.get(f"/v1/provider/nodes/{node_id}/benchmarks", headers=mine)
    assert history.status_code == 200
    assert [run["id"] for run in history.json()] == [second.id, first.id]
    assert history.json()[0]["errors"] == ["storage: a note only the provider sees"]
    limited = await client.get(f"/v1/provider/nodes/{node_id}/benchmarks?limit=1", headers=mine)
    assert len(limited.json()) == 1

    other = await create_provider(client, "Other Farm")
    theirs = {"Authorization": f"Bearer {other.key}"}
    refused = await client.get(f"/v1/provider/nodes/{node_id}/benchmarks", headers=theirs)
    assert refused.status_code == 404

    latest = (await client.get(f"/v1/nodes/{node_id}/benchmarks", headers=tenant.headers)).json()
    assert latest["latest"]["id"] == second.id and latest["latest"]["passed"] is True
    assert latest["latest"]["errors"] == []
    assert latest["latest"]["gpus"][0]["components"]["memory_bandwidth"]["reference"] == 3350.0
    nodes = (await client.get("/v1/nodes", headers=tenant.headers)).json()
    assert nodes[0]["gpus"][0]["benchmark_score"] == pytest.approx(0.8)


async def test_the_network_probes_answer_nodes_only_and_within_their_bounds(
    client: httpx.AsyncClient, sim_agent: AgentFactory, provider: ProviderHandle
) -> None:
    agent = await sim_agent()
    node = {"Authorization": f"Bearer {agent.client.key}"}
    assert (await client.get("/v1/agent/benchmarks/ping", headers=node)).json() == {"ok": True}
    got = await client.get("/v1/agent/benchmarks/download?bytes=3000000", headers=node)
    assert got.status_code == 200 and len(got.content) == 3_000_000 and set(got.content) == {0}
    too_many = await client.get(
        f"/v1/agent/benchmarks/download?bytes={wire.MAX_DOWNLOAD_BYTES + 1}", headers=node
    )
    assert too_many.status_code == 422
    sent = await client.post(
        "/v1/agent/benchmarks/upload", content=b"\x01" * 2_500_000, headers=node
    )
    assert sent.json() == {"received_bytes": 2_500_000}
    huge = await client.post(
        "/v1/agent/benchmarks/upload",
        content=b"\x00" * 16,
        headers={**node, "Content-Length": str(wire.MAX_UPLOAD_BYTES + 1)},
    )
    assert huge.status_code == 413
    assert (await agent.client.benchmark_download(1_000_000, 30.0)) == 1_000_000
    assert (await agent.client.benchmark_upload(3_000_000, 30.0)) == 3_000_000
    mine = {"Authorization": f"Bearer {provider.key}"}
    assert (await client.get("/v1/agent/benchmarks/ping", headers=mine)).status_code == 403


def test_the_gpu_score_weighs_the_four_parts_equally_and_tensor_is_bf16_and_tf32() -> None:
    h100 = gpu_catalog.REFERENCES["h100-80gb"]
    figures = {
        "fp32": h100.fp32_tflops,  # 1.0
        "fp16": h100.fp16_tflops / 2,  # 0.5
        "bf16": h100.bf16_tflops,  # tensor: (1.0 + 0.5) / 2
        "tf32": h100.tf32_tflops / 2,
        "memory_bandwidth": h100.memory_bandwidth_gbs * 2,  # capped at 1.0
    }
    assert benchmarks.gpu_score(figures, h100) == pytest.approx((1 + 0.5 + 0.75 + 1) / 4, abs=1e-4)
    # A part not measured gives its weight to the others (CuPy has no bfloat16).
    del figures["bf16"], figures["tf32"]
    assert benchmarks.gpu_score(figures, h100) == pytest.approx((1 + 0.5 + 1) / 3, abs=1e-4)


@pytest.mark.parametrize(
    ("claimed", "measures_as", "flagged"),
    [
        ("NVIDIA H100 80GB HBM3", "l4-24gb", "l4-24gb"),
        ("NVIDIA H100 PCIe", "h100-pcie-80gb", None),  # a PCIe card held to its own figures
        ("NVIDIA GeForce RTX 4090", "rtx-4090-24gb", None),
        ("NVIDIA A100-SXM4-80GB", "rtx-a6000-48gb", "rtx-a6000-48gb"),  # faster FP32, yet
        ("NVIDIA H100 80GB HBM3", "h100-pcie-80gb", "h100-pcie-80gb"),
    ],
)
def test_a_card_is_held_to_the_figures_of_the_model_nvml_names(
    claimed: str, measures_as: str, flagged: str | None
) -> None:
    gpu = GpuInfo(index=0, uuid="GPU-x", model=claimed, vram_mb=81_000)
    verdict = benchmarks.score_gpu(
        measured_like(gpu, measures_as), claimed, gpu.vram_mb, Tier.ENTERPRISE
    )
    assert verdict.performs_like == flagged
    assert verdict.passed is (flagged is None)


async def test_the_provider_page_shows_each_gpu_against_its_datasheet_and_the_history(
    client: httpx.AsyncClient, sim_agent: AgentFactory, provider: ProviderHandle
) -> None:
    await signed_in(client, provider.key)
    agent = await sim_agent(inventory(gpus=[H100], hostname="rack-3-node-1"))
    empty = (await client.get("/provider/benchmarks")).text
    assert "rack-3-node-1" in empty and "No benchmark has run yet" in empty

    await agent.client.report_benchmark(report(measured_like(H100, "h100-80gb")))
    await agent.client.report_benchmark(report(measured_like(H100, "l4-24gb")))
    page = (await client.get("/provider/benchmarks")).text
    assert "No benchmark has run yet" not in page
    assert f'id="gpu-{H100.uuid}"' in page and "against NVIDIA H100 80GB" in page
    assert "it measures like an NVIDIA L4 24GB, not the NVIDIA H100 80GB it reports" in page
    assert "989.4 TFLOP/s" in page and "10 %" in page  # FP16: measured against reference
    assert '<span class="badge s-failed">delisted</span>' in page  # the GPU
    assert '<span class="badge s-failed">failed</span>' in page  # its latest run
    assert "data-values='[0.8, 0.1" in page  # the score's history, oldest first


async def test_an_admin_asks_a_node_to_benchmark_itself_from_the_nodes_page(
    client: httpx.AsyncClient, sim_agent: AgentFactory
) -> None:
    agent = await sim_agent(inventory(hostname="gpu-box-2"))
    await signed_in(client, TEST_ADMIN_KEY)
    page = await client.get("/admin/nodes")
    assert f'action="/admin/nodes/{agent.node_id}/benchmark"' in page.text
    asked = await client.post(
        f"/admin/nodes/{agent.node_id}/benchmark", data={"csrf": csrf_of(page.text)}
    )
    assert asked.status_code == 303 and asked.headers["location"].endswith(f"#{agent.node_id}")
    assert (await agent.heartbeat()).run_benchmark is True
    forged = await client.post(f"/admin/nodes/{agent.node_id}/benchmark", data={"csrf": "x"})
    assert forged.status_code == 403
    missing = await client.post(
        "/admin/nodes/nod_0000000000000000000000000a/benchmark", data={"csrf": csrf_of(page.text)}
    )
    assert missing.status_code == 404
