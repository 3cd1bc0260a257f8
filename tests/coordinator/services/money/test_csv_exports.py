"""Every CSV export goes through the one writer (core/csv_export.py): what a node reports
about itself (its GPU model, its hostname) and what a provider names itself reaches the
tenant's usage CSV, the provider's earnings CSV and the admin's payout batch export as
text, never as a formula a spreadsheet would run."""

import csv
import io
from datetime import UTC, datetime

import httpx
from fastapi import FastAPI

from gpu_share.coordinator.loops import payouts as payout_loop
from gpu_share.coordinator.services.nodes import prices
from gpu_share.protocol.nodes import GpuInfo
from gpu_share.protocol.prices import PriceUpdate
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.earnings import move_to
from gpu_share.testing.factories import ADMIN, HELLO_WORLD, ProviderHandle, TenantHandle, bearer
from gpu_share.testing.simulated_agent import H100, AgentFactory, done_report, inventory

HOSTILE_MODEL = '=HYPERLINK("http://x","y")'
HOSTILE_HOST = "@SUM(1+1)*cmd|' /C calc'!A0"
HOSTILE_HOLDER = "+cmd|' /C calc'!A0"
WEDNESDAY = datetime(2026, 11, 25, 12, tzinfo=UTC)
PAYDAY = datetime(2026, 12, 7, 0, 30, tzinfo=UTC)  # a Monday, weeks after the charge


def rows(answer: httpx.Response) -> list[dict[str, str]]:
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/csv")
    return list(csv.DictReader(io.StringIO(answer.text, newline="")))


async def test_what_a_node_and_a_provider_say_of_themselves_is_text_in_every_export(
    client: httpx.AsyncClient,
    app: FastAPI,
    tenant: TenantHandle,
    provider: ProviderHandle,
    sim_agent: AgentFactory,
    clock: FrozenClock,
) -> None:
    move_to(clock, WEDNESDAY)
    gpu = GpuInfo.model_validate({**H100.model_dump(), "model": HOSTILE_MODEL})
    agent = await sim_agent(
        inventory(runtimes=[RuntimeName.ONNX_CUDA], gpus=[gpu], hostname=HOSTILE_HOST)
    )
    async with app.state.replica.db.write() as session:  # its "/" has no URL to price it by
        update = PriceUpdate.model_validate({"price_per_gpu_hour": "1000", "spot_discount_pct": 50})
        await prices.set_price(session, provider.id, HOSTILE_MODEL, update, clock.now())
    method = {
        "kind": "bank_transfer",
        "account_holder": HOSTILE_HOLDER,
        "iban": "DE89 3704 0044 0532 0130 00",
        "bic": "COBADEFFXXX",
    }
    settings = await client.put(
        "/v1/provider/payout-settings",
        json={"method": method, "schedule": "weekly"},
        headers=bearer(provider.key),
    )
    assert settings.status_code == 200, settings.text
    credited = await client.post(
        f"/v1/admin/tenants/{tenant.id}/top-ups",
        json={"amount": "500", "reference": "wire-1"},
        headers=ADMIN,
    )
    assert credited.status_code == 201, credited.text
    submitted = await client.post("/v1/gpu/invoke", json=HELLO_WORLD, headers=tenant.headers)
    assert submitted.status_code == 202, submitted.text
    (job,) = await agent.lease()
    await agent.client.start(job.invoke_id, job.lease_token)
    clock.advance(60)  # 1000 USDC an hour: 16.666667 USDC, above the weekly minimum
    await agent.client.report(job.invoke_id, done_report(job, device="cuda"), retry_for=0)

    day = WEDNESDAY.date().isoformat()
    [usage] = rows(
        await client.get(f"/v1/billing/usage.csv?from={day}&to={day}", headers=tenant.headers)
    )
    assert (usage["work_id"], usage["gpu_model"]) == (job.invoke_id, "'" + HOSTILE_MODEL)

    [earned] = rows(
        await client.get(
            f"/v1/provider/earnings.csv?since={day}&until={day}", headers=bearer(provider.key)
        )
    )
    assert (earned["gpu_model"], earned["hostname"]) == ("'" + HOSTILE_MODEL, "'" + HOSTILE_HOST)

    move_to(clock, PAYDAY)
    await payout_loop.run_once(app.state.replica)
    [batch] = (await client.get("/v1/admin/payout-batches", headers=ADMIN)).json()
    [payout] = rows(
        await client.get(f"/v1/admin/payout-batches/{batch['id']}/export", headers=ADMIN)
    )
    assert (payout["provider_id"], payout["account_holder"]) == (
        provider.id,
        "'" + HOSTILE_HOLDER,
    )
