"""The tenant's Usage page and the admin's top-up form, in a real browser against a
real coordinator: the balance an admin credits, charges per day and per runtime with
their chart, and the CSV of every charge."""

import asyncio
from datetime import timedelta
from pathlib import Path

from playwright.async_api import expect

from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.orm import NodeRow, ProviderPriceRow, ProviderRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.money import billing, ledger
from gpu_share.coordinator.services.money.ledger import ChargeDetails, TransactionKind
from gpu_share.protocol.money import to_micro, usdc_text
from gpu_share.testing.clock import SystemClock
from gpu_share.testing.factories import TEST_ADMIN_KEY, create_tenant
from gpu_share.testing.live import Live
from gpu_share.testing.simulated_agent import SimulatedAgent, done_report
from tests.web.conftest import Browsing, screenshot, sign_in, signed_in_client

RATE = 36_000_000  # 36 USDC per CPU-hour: 0.01 USDC a second


async def past_charges(db: Database, tenant_id: str, node_id: str) -> None:
    """Charges of earlier days, posted as settling an invoke posts them."""
    now = SystemClock().now()
    async with db.write() as session:
        node = await session.get(NodeRow, node_id)
        assert node is not None
        for days_ago, seconds, runtime in (
            (9, 120, "onnx_cpu"),
            (5, 300, "catboost_cpu"),
            (2, 60, "onnx_cpu"),
        ):
            at = now - timedelta(days=days_ago)
            work_id = f"inv_past{days_ago}"
            cost = billing.metered(RATE, seconds * 1000)
            provider_share, commission = ledger.split_commission(cost, 1500)
            await ledger.post(
                session,
                cause=billing.reserve_cause(work_id),
                kind=TransactionKind.RESERVE,
                entries=ledger.transfer(
                    ledger.tenant_balance(tenant_id), ledger.tenant_reserved(tenant_id), cost
                ),
                now=at,
            )
            details: ChargeDetails = {
                "tenant_id": tenant_id,
                "provider_id": node.provider_id,
                "node_id": node_id,
                "work": "invoke",
                "work_id": work_id,
                "runtime": runtime,
                "gpu_model": "cpu",
                "gpus": 1,
                "spot": False,
                "seconds": float(seconds),
                "rate_micro_per_hour": RATE,
                "cost_micro": cost,
                "provider_micro": provider_share,
                "commission_micro": commission,
                "started_at": (at - timedelta(seconds=seconds)).isoformat(),
                "ended_at": at.isoformat(),
            }
            await ledger.post(
                session,
                cause=billing.settle_cause(work_id),
                kind=TransactionKind.CHARGE,
                entries=billing.charge_entries(tenant_id, node.provider_id, cost, cost, commission),
                now=at,
                details=details,
            )


async def test_an_admin_tops_up_and_the_tenant_sees_its_usage_in_a_browser(
    live: Live, browsing: Browsing, settings: Settings, tmp_path: Path
) -> None:
    tenant = await create_tenant(live.http, "Usage Co")
    agent = SimulatedAgent(live.base_url)
    await agent.register(live.enrollment_token)
    db = Database(settings.database_url)
    try:
        async with agent.beating():  # online however long the browser takes
            async with db.write() as session:
                node = await session.get(NodeRow, agent.node_id)
                assert node is not None
                provider = await session.get(ProviderRow, node.provider_id)
                assert provider is not None
                session.add(
                    ProviderPriceRow(
                        provider_id=provider.id,
                        gpu_model="cpu",
                        price_micro_per_hour=RATE,
                        spot_discount_bps=5000,
                        updated_at=SystemClock().now(),
                    )
                )
                node.price_per_gpu_hour_micro = RATE

            page = browsing.page
            await sign_in(page, live.base_url, TEST_ADMIN_KEY)
            await page.goto(f"{live.base_url}/admin/tenants")
            await page.get_by_label("Amount in USDC for Usage Co").fill("25")
            await page.get_by_label("Payment reference for Usage Co").fill("wire-2026-001")
            await page.get_by_role("button", name="Top up Usage Co").click()
            await expect(
                page.get_by_text("Credited 25 USDC (reference wire-2026-001)")
            ).to_be_visible()
            await page.get_by_label("Amount in USDC for Usage Co").fill("25")  # sent again
            await page.get_by_label("Payment reference for Usage Co").fill("wire-2026-001")
            await page.get_by_role("button", name="Top up Usage Co").click()
            await expect(page.get_by_text("was credited before; nothing added")).to_be_visible()
            await page.get_by_label("Amount in USDC for Usage Co").fill("0.0000001")
            await page.get_by_label("Payment reference for Usage Co").fill("wire-2026-002")
            await page.get_by_role("button", name="Top up Usage Co").click()
            await expect(page.get_by_text("six decimal places")).to_be_visible()

            await past_charges(db, tenant.id, agent.node_id or "")
            answer = await live.http.post(
                "/v1/gpu/invoke",
                json={"runtime": "onnx_cpu", "model_url": "https://example.com/m.onnx"},
                headers=tenant.headers,
            )
            assert answer.status_code == 202, answer.text
            (job,) = await agent.lease(wait=5)
            await agent.client.start(job.invoke_id, job.lease_token)
            await asyncio.sleep(1.0)
            await agent.client.report(job.invoke_id, done_report(job), retry_for=0)
            invoke = (
                await live.http.get(f"/v1/gpu/invokes/{job.invoke_id}", headers=tenant.headers)
            ).json()
            cost = invoke["cost"]
            assert cost is not None and float(cost) >= 0.01, invoke

            await page.context.clear_cookies()
            await sign_in(page, live.base_url, tenant.key)
            await page.get_by_role("link", name="Usage").click()
            await expect(page.get_by_role("heading", name="Usage", exact=True)).to_be_visible()
            spent = 1_200_000 + 3_000_000 + 600_000 + to_micro(cost)
            assert await page.locator("#spent").inner_text() == f"{usdc_text(spent)} USDC"
            available = usdc_text(25_000_000 - spent)
            assert await page.locator("#available").inner_text() == f"{available} USDC"
            assert await page.locator("#reserved").inner_text() == "0 USDC"
            bars = page.locator("#spend-chart rect.bar")
            assert await bars.count() == 4  # 9, 5 and 2 days ago, and today
            assert await page.locator("#spend-chart text.tick").count() == 5  # 0 to the top
            label = await page.locator("#spend-chart svg").get_attribute("aria-labelledby")
            title = await page.locator(f"#{label}").text_content()
            assert title is not None and f"{usdc_text(spent)} USDC in all" in title
            runtimes = await page.locator("section[aria-labelledby=per-runtime] tbody").inner_text()
            assert "catboost_cpu" in runtimes and "3 USDC" in runtimes
            assert await page.get_by_role("link", name=job.invoke_id).count() == 1
            assert browsing.outside == []
            await screenshot(page, tmp_path, "tenant-usage")

            await page.goto(f"{live.base_url}/console/invokes/{job.invoke_id}")
            await expect(page.locator("#cost")).to_contain_text(f"{cost} USDC")

            async with signed_in_client(live.base_url, tenant.key) as http:
                csv = await http.get("/console/usage.csv")
            assert csv.headers["content-type"].startswith("text/csv")
            assert len(csv.text.strip().splitlines()) == 1 + 4
    finally:
        await agent.aclose()
        await db.dispose()
