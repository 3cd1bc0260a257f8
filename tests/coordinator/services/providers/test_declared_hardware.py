"""Declared and proven hardware (docs/trust.md): what an approved application declared,
GPUs per model, against what the provider's machines proved in hardware challenges; each
difference is one line, for the provider (`GET /v1/provider/hardware`) and the admin."""

from collections import Counter
from datetime import UTC, datetime
from typing import Any

import httpx
from fastapi import FastAPI

from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.coordinator.services.providers import declared_hardware
from gpu_share.protocol.nodes import GpuInfo
from gpu_share.testing.applications import approved_provider
from gpu_share.testing.factories import ADMIN, TEST_ADMIN_KEY, ProviderHandle, bearer
from gpu_share.testing.simulated_agent import H100, SimulatedAgent, inventory
from gpu_share.testing.verification import mark_verified
from tests.coordinator.services.providers.test_provider_applications import APPLICATION
from tests.web.admin.test_pages import signed_in

PROVEN = "2026-01-01T00:00:00+00:00"


def gpu(uuid: str, model: str = "NVIDIA H100 80GB HBM3", vram_mb: int = 81559) -> dict[str, Any]:
    return {"uuid": uuid, "model": model, "vram_mb": vram_mb}


def proof(model: str) -> dict[str, Any]:
    return {"model": model, "verified_at": PROVEN, "challenge_id": "chl_x", "rate_tflops": 700.0}


def entry(model: str, count: int, other: str | None = None) -> dict[str, Any]:
    return {
        "model": model,
        "other_model": other,
        "count": count,
        "system_ram_gb": 512,
        "internet_up_gbps": 10,
        "internet_down_gbps": 10,
        "location": "Frankfurt",
    }


def test_each_difference_is_a_line_declared_models_first() -> None:
    declared = Counter({"NVIDIA H100 80GB": 8, "NVIDIA L4 24GB": 2, "NVIDIA A100 40GB": 1})
    proven = Counter({"NVIDIA H100 80GB": 2, "NVIDIA L4 24GB": 2, "NVIDIA L40S 48GB": 1})
    assert declared_hardware.mismatches(declared, proven) == [
        "declared 8 × NVIDIA H100 80GB, proven 2",
        "declared 1 × NVIDIA A100 40GB, proven 0",
        "proven 1 × NVIDIA L40S 48GB, not declared",
    ]
    assert declared_hardware.mismatches(declared, declared) == []


def test_proven_counts_variants_as_applied_and_skips_quarantined_and_unproven_machines() -> None:
    pcie = NodeRow(
        id="nod_a",
        gpus=[gpu("GPU-a", "NVIDIA H100 PCIe", 81559), gpu("GPU-b")],
        verification={"GPU-a": proof("NVIDIA H100 PCIe 80GB"), "GPU-b": proof("NVIDIA H100 80GB")},
    )
    caught = NodeRow(
        id="nod_b",
        gpus=[gpu("GPU-c")],
        verification={"GPU-c": proof("NVIDIA H100 80GB")},
        quarantined_at=datetime(2026, 1, 2, tzinfo=UTC),
    )
    claiming = NodeRow(id="nod_c", gpus=[gpu("GPU-d")], verification=None)
    hardware = declared_hardware.compare(
        [[entry("h100-80gb", 2), entry("other", 2, "NVIDIA B200")]], [pcie, caught, claiming]
    )
    assert [(c.model, c.count) for c in hardware.proven] == [("NVIDIA H100 80GB", 2)]
    assert hardware.mismatches == ["declared 2 × NVIDIA B200 (other), proven 0"]


def test_a_provider_without_an_application_has_nothing_to_compare_with() -> None:
    node = NodeRow(
        id="nod_a", gpus=[gpu("GPU-a")], verification={"GPU-a": proof("NVIDIA H100 80GB")}
    )
    hardware = declared_hardware.compare([], [node])
    assert hardware.declared is None and hardware.mismatches == []
    assert [(c.model, c.count) for c in hardware.proven] == [("NVIDIA H100 80GB", 1)]


async def approved(client: httpx.AsyncClient) -> ProviderHandle:
    """An application for 8 H100s and 2 B200s ("other"), approved and claimed."""
    claimed = await approved_provider(client, APPLICATION)
    me = (await client.get("/v1/provider/me", headers=bearer(claimed["api_key"]))).json()
    return ProviderHandle(me["id"], claimed["api_key"], claimed["enrollment_token"])


async def test_the_provider_and_the_admin_see_what_differs(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    provider = await approved(client)
    l4 = GpuInfo(index=2, uuid="GPU-l4-0001", model="NVIDIA L4", vram_mb=23034)
    cards = [H100, H100.model_copy(update={"index": 1, "uuid": f"{H100.uuid}-2"}), l4]
    agent = SimulatedAgent(
        "http://testserver",
        transport=httpx.ASGITransport(app=app),
        node_inventory=inventory(gpus=cards),
    )
    await agent.register(provider.enrollment_token)
    assert agent.node_id is not None
    mine = bearer(provider.key)

    before = (await client.get("/v1/provider/hardware", headers=mine)).json()
    assert [(c["model"], c["count"]) for c in before["declared"]] == [
        ("NVIDIA H100 80GB", 8),
        ("NVIDIA B200 (other)", 2),
    ]
    assert before["proven"] == []  # registered: nothing proven by registering
    assert before["mismatches"] == [
        "declared 8 × NVIDIA H100 80GB, proven 0",
        "declared 2 × NVIDIA B200 (other), proven 0",
    ]

    await mark_verified(app.state.replica, agent.node_id)
    after = (await client.get("/v1/provider/hardware", headers=mine)).json()
    lines = [
        "declared 8 × NVIDIA H100 80GB, proven 2",
        "declared 2 × NVIDIA B200 (other), proven 0",
        "proven 1 × NVIDIA L4 24GB, not declared",
    ]
    assert after["mismatches"] == lines

    await signed_in(client, TEST_ADMIN_KEY)
    providers_page = (await client.get("/admin/providers")).text
    assert all(line in providers_page for line in lines), providers_page
    nodes_page = (await client.get("/admin/nodes", params={"provider": provider.id})).text
    assert 'id="declared-hardware"' in nodes_page
    assert all(line in nodes_page for line in lines)
    assert nodes_page.count("verified</span>") == 3

    other = await client.get("/v1/provider/hardware", headers=ADMIN)
    assert other.status_code in (401, 403)  # the provider's own, with a provider key
