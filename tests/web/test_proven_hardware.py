"""Proven hardware on the pages, in a real browser (docs/trust.md): the provider's machines
and the admin's provider and node pages show what each GPU proved (or why not yet) and
how it differs from what the application declared; the marketplace shows verified
machines only, with a badge, unless the tenant ticks the box that shows the others."""

from datetime import timedelta
from pathlib import Path

from gpu_share.coordinator.core.orm import ChallengeRow, NodeRow
from gpu_share.protocol.nodes import GpuInfo
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.protocol.trust import ChallengeKind, ChallengeParams, ChallengeStatus
from gpu_share.testing.applications import approved_provider
from gpu_share.testing.factories import TEST_ADMIN_KEY, bearer
from gpu_share.testing.live import Live
from gpu_share.testing.simulated_agent import SimulatedAgent, inventory
from gpu_share.testing.verification import mark_verified, proofs_for
from tests.coordinator.services.providers.test_provider_applications import APPLICATION
from tests.web.conftest import Browsing, screenshot, sign_in
from tests.web.provider.test_machines import H100
from tests.web.tenant.test_marketplace import key_of

L4 = GpuInfo(index=2, uuid="GPU-l4-77", model="NVIDIA L4", vram_mb=23034, cuda_version="12.4")
CARDS = [
    H100,
    H100.model_copy(update={"index": 1, "uuid": "GPU-7f3b"}),
    L4,
    H100.model_copy(update={"index": 3, "uuid": "GPU-7f3d"}),
]
MISMATCHES = [
    "declared 8 × NVIDIA H100 80GB, proven 1",
    "declared 2 × NVIDIA B200 (other), proven 0",
    "proven 1 × NVIDIA L4 24GB, not declared",
]
TOO_SLOW = "committed after 61.0 s; the deadline was 50.0 s from the start"
PARAMS = ChallengeParams(
    kind=ChallengeKind.GPU,
    width=2048,
    rows=16384,
    steps=64,
    sketch_rows=1024,
    samples=6,
    deadline_sec=50.0,
    target_sec=4.0,
)


async def prove_some(live: Live, node_id: str) -> None:
    """GPU 0 and the L4 passed their challenges; GPU 1 failed one; GPU 3's waits."""
    assert live.replica is not None
    async with live.replica.db.write() as session:
        node = await session.get(NodeRow, node_id)
        assert node is not None
        now = live.replica.clock.now()
        proofs = proofs_for(node, now - timedelta(days=2))
        node.verification = {uuid: proofs[uuid] for uuid in (H100.uuid, L4.uuid)}
        for n, (target, status) in enumerate(
            (("GPU-7f3b", ChallengeStatus.FAILED), ("GPU-7f3d", ChallengeStatus.ISSUED))
        ):
            final = status is ChallengeStatus.FAILED
            session.add(
                ChallengeRow(
                    id=f"chl_test{n}",
                    node_id=node_id,
                    target=target,
                    claimed_model="NVIDIA H100 80GB",
                    params=PARAMS.model_dump(mode="json"),
                    seed="0" * 32,
                    status=status.value,
                    issued_at=now - timedelta(minutes=10) if final else now,
                    finished_at=now - timedelta(minutes=9) if final else None,
                    verdict={"reason": TOO_SLOW} if final else None,
                )
            )


async def test_declared_and_proven_hardware_show_to_provider_admin_and_tenant(
    live: Live, browsing: Browsing, tmp_path: Path
) -> None:
    claimed = await approved_provider(live.http, APPLICATION)  # declared 8 × H100 80GB and 2 × B200
    key, token = claimed["api_key"], claimed["enrollment_token"]
    agent = SimulatedAgent(live.base_url)
    await agent.register(token)
    await agent.client.update_inventory(
        inventory(hostname="rack-7", runtimes=[RuntimeName.ONNX_CUDA], gpus=CARDS)
    )
    assert agent.node_id is not None
    await prove_some(live, agent.node_id)

    hardware = (await live.http.get("/v1/provider/hardware", headers=bearer(key))).json()
    assert hardware["mismatches"] == MISMATCHES
    assert {c["model"]: c["count"] for c in hardware["proven"]} == {
        "NVIDIA H100 80GB": 1,
        "NVIDIA L4 24GB": 1,
    }

    page = browsing.page
    await sign_in(page, live.base_url, key)
    declared = page.locator("#declared-hardware")
    assert await declared.is_visible()
    assert [line.strip() for line in await declared.locator("li").all_inner_texts()] == MISMATCHES
    machine = page.locator(f"#machine-{agent.node_id}")
    rows = [r.strip() for r in await machine.locator("tbody tr").all_inner_texts()]
    assert "verified" in rows[0] and "since" in rows[0]
    assert "challenge failed" in rows[1] and TOO_SLOW in rows[1]
    assert "verified" in rows[2] and "L4" in rows[2]
    assert "challenge pending" in rows[3]
    await screenshot(page, tmp_path, "provider-proven-hardware")

    await page.context.clear_cookies()
    await sign_in(page, live.base_url, TEST_ADMIN_KEY)
    await page.goto(f"{live.base_url}/admin/providers")
    listed = page.locator(".hardware-mismatches li")
    assert [line.strip() for line in await listed.all_inner_texts()] == MISMATCHES
    provider_id = (await live.http.get("/v1/provider/me", headers=bearer(key))).json()["id"]
    await page.locator(f'a[href="/admin/nodes?provider={provider_id}"]').first.click()
    assert [
        line.strip() for line in await page.locator("#declared-hardware li").all_inner_texts()
    ] == MISMATCHES
    node = await page.locator(f"tr#{agent.node_id}").inner_text()
    assert node.count("verified since") == 2, node
    assert "challenge failed" in node and "challenge pending" in node
    await screenshot(page, tmp_path, "admin-proven-hardware")

    await page.context.clear_cookies()
    await sign_in(page, live.base_url, key_of(live))
    async with agent.beating():  # online (offered) however long the browser takes
        await page.goto(f"{live.base_url}/console/marketplace")
        assert agent.node_id not in await page.locator("main").inner_text()  # not all proven
        await page.get_by_label("Show unverified machines").check()
        await page.get_by_role("button", name="Show offers").click()
        row = page.locator("main table tbody tr", has_text=agent.node_id)
        assert "Unverified" in await row.inner_text()
        assert live.replica is not None
        await mark_verified(live.replica, agent.node_id)
        await page.goto(f"{live.base_url}/console/marketplace")
        row = page.locator("main table tbody tr", has_text=agent.node_id)
        assert "Verified" in await row.inner_text() and "Unverified" not in await row.inner_text()
        await screenshot(page, tmp_path, "tenant-marketplace-verified")
    assert browsing.outside == []
    await agent.aclose()
