"""Earnings and Payouts in a real browser (Debian's Chromium, no internet): a provider
reads their earnings and sets a Solana payout method through the form, a wrong address
is refused next to its field; an admin exports a batch and marks payouts paid and
failed."""

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.money import payouts
from gpu_share.protocol.payouts import PayoutSchedule
from gpu_share.testing.applications import approved_provider
from gpu_share.testing.earnings import post_charge
from gpu_share.testing.factories import TEST_ADMIN_KEY
from gpu_share.testing.live import Live
from gpu_share.testing.simulated_agent import SimulatedAgent, inventory
from tests.coordinator.services.providers.test_provider_applications import APPLICATION
from tests.web.conftest import Browsing, screenshot, sign_in
from tests.web.provider.test_machines import H100

ADDRESS = "7xKXtg2CW87d97TXJSDpbD5jBkheTqA83TZRuJosgAsU"
A100 = "NVIDIA A100-SXM4-80GB"


@pytest.fixture
async def db(settings: Settings) -> AsyncIterator[Database]:
    database = Database(settings.database_url)
    yield database
    await database.dispose()


async def provider_with_earnings(live: Live, db: Database) -> tuple[str, str]:
    """(key, provider id) of an approved provider with a machine and a week of charges:
    the last two still held, the others posted before earnings were held (payable)."""
    claimed = await approved_provider(live.http, APPLICATION)
    key, token = claimed["api_key"], claimed["enrollment_token"]
    me = (await live.http.get("/v1/provider/me", headers={"Authorization": f"Bearer {key}"})).json()
    agent = SimulatedAgent(live.base_url)
    node_id = await agent.register(token)
    await agent.client.update_inventory(inventory(gpus=[H100], hostname="rack-7-node-2"))
    await agent.aclose()
    now = datetime.now(UTC).replace(microsecond=0)
    for days, earned, commission, node, model, gpus, hours in [
        (9, 4_250_000, 750_000, node_id, H100.model, 1, 2.5),
        (6, 12_750_000, 2_250_000, node_id, H100.model, 2, 3.75),
        (3, 1_700_000, 300_000, "node_retired", A100, 1, 1.0),
        (1, 8_500_000, 1_500_000, node_id, H100.model, 1, 5.0),
        (0, 425_000, 75_000, node_id, H100.model, 1, 0.25),
    ]:
        await post_charge(
            db,
            me["id"],
            at=now - timedelta(days=days, minutes=5),
            provider_micro=earned,
            commission_micro=commission,
            node_id=node,
            gpu_model=model,
            gpus=gpus,
            seconds=hours * 3600,
            held=days <= 1,
        )
    return key, me["id"]


async def test_a_provider_reads_earnings_and_sets_a_solana_payout_method(
    live: Live, db: Database, browsing: Browsing, tmp_path: Path
) -> None:
    key, _provider_id = await provider_with_earnings(live, db)
    page = browsing.page
    await sign_in(page, live.base_url, key)

    await page.get_by_role("navigation", name="Main").get_by_role("link", name="Earnings").click()
    await page.wait_for_load_state()
    assert (await page.locator("#payable").inner_text()).startswith("18.7")
    assert (await page.locator("#held").inner_text()).startswith("8.925")
    releases = page.locator("#releases tbody tr")
    assert await releases.count() == 2  # two charges a day apart, each held 7 days
    assert "8.5" in await releases.nth(0).inner_text()
    assert "0.425" in await releases.nth(1).inner_text()
    history = page.locator("#history + p + .table-wrap tbody")
    assert await history.get_by_text("held until").count() == 2
    assert "No payout method yet" in await page.locator(".earnings-stats").inner_text()
    bars = await page.locator("#earnings-chart rect.bar").count()  # a bar a day earned
    assert bars > 1
    assert await page.locator("#earnings-chart text.unit").text_content() == "USDC"
    await page.locator("#earnings-chart summary").click()
    assert await page.locator("#earnings-chart details tbody tr").count() == bars
    per_model = await page.locator("#per-model + .table-wrap").inner_text()
    assert "NVIDIA H100 80GB HBM3" in per_model and "25.925" in per_model
    per_gpu = await page.locator("#per-gpu + .table-wrap").inner_text()
    assert "rack-7-node-2" in per_gpu and "node_retired" in per_gpu
    assert await page.locator("#history + p + .table-wrap tbody tr").count() == 5
    csv_link = page.get_by_role("link", name="Download CSV")
    async with page.expect_download() as download_info:
        await csv_link.click()
    download = await download_info.value
    assert download.suggested_filename.startswith("earnings-")
    content = Path(await download.path()).read_text()
    assert content.count("\n") == 6 and "rack-7-node-2" in content
    await screenshot(page, tmp_path, "provider-earnings")

    await page.get_by_label("From", exact=True).fill("2020-02-01")
    await page.get_by_role("button", name="Show").click()
    await page.wait_for_load_state()
    assert "the range can span at most 366 days" in await page.get_by_role("alert").inner_text()

    await page.get_by_role("navigation", name="Main").get_by_role("link", name="Payouts").click()
    await page.wait_for_load_state()
    assert await page.get_by_text("No payouts yet").is_visible()
    payable_only = await page.locator("#payable-only").inner_text()
    assert "Payouts are made from payable earnings only" in payable_only
    assert "Payable now: 18.7 USDC; still held: 8.925 USDC" in payable_only
    await page.get_by_label("Solana address").fill(ADDRESS[:-1] + "0")  # 0 is not base58
    await page.get_by_role("button", name="Save payout settings").click()
    await page.wait_for_load_state()
    alert = await page.get_by_role("alert").inner_text()
    assert "Solana address: a Solana address is base58 and cannot contain '0'" in alert
    assert await page.locator("#address").get_attribute("aria-invalid") == "true"
    await screenshot(page, tmp_path, "provider-payouts-invalid")

    await page.get_by_label("Solana address").fill(ADDRESS)
    await page.get_by_label("Monthly, on the first business day").check()
    await page.get_by_role("button", name="Save payout settings").click()
    await page.wait_for_load_state()
    assert (
        "Saved: monthly payouts by USDC on Solana" in await page.get_by_role("status").inner_text()
    )
    assert ADDRESS in await page.locator("#method-now").inner_text()
    assert browsing.outside == []


async def test_an_admin_exports_a_batch_and_settles_its_payouts(
    live: Live, db: Database, browsing: Browsing, tmp_path: Path
) -> None:
    key, _ = await provider_with_earnings(live, db)
    claimed = await approved_provider(live.http, APPLICATION)
    other_key = claimed["api_key"]
    headers = {"Authorization": f"Bearer {key}"}
    saved = await live.http.put(
        "/v1/provider/payout-settings",
        json={"method": {"kind": "solana_usdc", "address": ADDRESS}, "schedule": "weekly"},
        headers=headers,
    )
    assert saved.status_code == 200
    other = (
        await live.http.get("/v1/provider/me", headers={"Authorization": f"Bearer {other_key}"})
    ).json()
    now = datetime.now(UTC)
    await post_charge(db, other["id"], at=now, provider_micro=15_000_000)
    await live.http.put(
        "/v1/provider/payout-settings",
        json={
            "method": {
                "kind": "bank_transfer",
                "account_holder": "Rechenzentrum Nord GmbH",
                "iban": "DE89370400440532013000",
                "bic": "COBADEFFXXX",
            }
        },
        headers={"Authorization": f"Bearer {other_key}"},
    )
    async with db.write() as session:
        batch_id = await payouts.make_batch(
            session, PayoutSchedule.WEEKLY, "2026-W50", now, 10_000_000, live.base_url
        )
    assert batch_id is not None

    page = browsing.page
    await sign_in(page, live.base_url, TEST_ADMIN_KEY)
    await page.get_by_role("navigation", name="Main").get_by_role("link", name="Payouts").click()
    await page.wait_for_load_state()
    row = page.locator(f"tr#{batch_id}")
    # 18.7 payable of the first (8.925 is still held) and the other's 15
    assert "33.7" in await row.inner_text() and "2 to settle" in await row.inner_text()
    await screenshot(page, tmp_path, "admin-payout-batches")
    await row.get_by_role("link", name="2026-W50").click()
    await page.wait_for_load_state()
    await screenshot(page, tmp_path, "admin-payouts")
    async with page.expect_download() as download_info:
        await page.get_by_role("link", name="Export CSV").click()
    exported = Path(await (await download_info.value).path()).read_text()
    assert ADDRESS in exported and "DE89370400440532013000" in exported

    rows = page.locator("table.payouts tbody tr")
    solana_row = rows.filter(has_text=ADDRESS)
    await solana_row.get_by_role("button", name="Mark paid").click()
    await page.wait_for_load_state()
    assert "enter the transaction's reference" in await page.get_by_role("alert").inner_text()
    signature = (
        "5VERv8NMvzbJMEkV8xnrLkEaWRtSz9CosKDYjCJjBRnbJLgp8uirBgmQpjKhoR4tjF3ZpRzrFmBV6UjKdiSZkQUW"
    )
    solana_row = page.locator("table.payouts tbody tr").filter(has_text=ADDRESS)
    await solana_row.get_by_placeholder("Transaction reference").fill(signature)
    await solana_row.get_by_role("button", name="Mark paid").click()
    await page.wait_for_load_state()
    assert "marked paid with reference" in await page.get_by_role("status").inner_text()
    bank_row = page.locator("table.payouts tbody tr").filter(has_text="Rechenzentrum")
    await bank_row.get_by_placeholder("Why it failed").fill("IBAN closed by the bank")
    await bank_row.get_by_role("button", name="Mark failed").click()
    await page.wait_for_load_state()
    assert "back in the provider's pending balance" in await page.get_by_role("status").inner_text()
    await screenshot(page, tmp_path, "admin-payouts-settled")

    mine = (await live.http.get("/v1/provider/payouts", headers=headers)).json()
    assert [(p["status"], p["reference"]) for p in mine] == [("paid", signature)]
    theirs = (
        await live.http.get(
            "/v1/provider/earnings", headers={"Authorization": f"Bearer {other_key}"}
        )
    ).json()
    assert theirs["pending"] == "15" and theirs["paid"] == "0"

    await page.context.clear_cookies()
    await sign_in(page, live.base_url, key)
    await page.goto(f"{live.base_url}/provider/payouts")
    history = await page.locator("table.payouts").inner_text()
    assert "paid" in history and signature in history and "2026-W50" in history
    await screenshot(page, tmp_path, "provider-payouts")
    assert browsing.outside == []
