"""`gpu-share up`'s platform (coordinator/embedded.py): its credentials on disk (the
enrollment token its local agent registers with expires like any other, so a later start
replaces it) and its demo money (a balance credited once, a price for the local node)."""

import json
import re
from datetime import UTC, datetime, timedelta

import httpx
from sqlalchemy import func, select

from gpu_share.coordinator import embedded
from gpu_share.coordinator.app import create_app
from gpu_share.coordinator.core import keys
from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.orm import EnrollmentTokenRow, LedgerTransactionRow
from gpu_share.coordinator.core.settings import BillingMode, Settings
from gpu_share.coordinator.services.money import ledger
from gpu_share.coordinator.services.money.ledger import TransactionKind
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import HELLO_WORLD, bearer
from gpu_share.testing.simulated_agent import SimulatedAgent, done_report, inventory


async def test_a_later_start_replaces_the_local_agents_expired_token_for_the_same_provider(
    settings: Settings,
) -> None:
    clock = FrozenClock(datetime.now(UTC).replace(microsecond=0))
    first = await embedded.prepare(settings, clock)
    assert (await embedded.prepare(settings, clock)) == first  # still good: kept

    clock.advance(timedelta(days=settings.enrollment_token_days).total_seconds())
    later = await embedded.prepare(settings, clock)
    assert later.enrollment_token != first.enrollment_token
    assert (later.admin_key, later.tenant_key) == (first.admin_key, first.tenant_key)
    on_disk = json.loads(embedded.credentials_path(settings).read_text())
    assert on_disk["enrollment_token"] == later.enrollment_token

    db = Database(settings.database_url)
    try:
        async with db.read() as session:
            rows = {
                row.token_hash: row
                for row in (await session.scalars(select(EnrollmentTokenRow))).all()
            }
    finally:
        await db.dispose()
    old, new = (
        rows[keys.hash_key(first.enrollment_token)],
        rows[keys.hash_key(later.enrollment_token)],
    )
    assert new.provider_id == old.provider_id  # the same local provider, its node kept
    assert new.expires_at is not None and new.expires_at > clock.now()


# `gpu-share up`'s demo money: a balance credited once, a price for the local node.


def demo(settings: Settings) -> Settings:
    return settings.model_copy(update={"demo_money": True})


async def sign_in(http: httpx.AsyncClient, key: str) -> None:
    form = await http.get("/signin")
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert csrf is not None
    done = await http.post("/signin", data={"csrf": csrf[1], "key": key})
    assert done.status_code == 303, done.text


async def test_up_credits_the_demo_balance_once_however_often_it_starts(
    settings: Settings,
) -> None:
    settings = demo(settings)
    clock = FrozenClock(datetime.now(UTC).replace(microsecond=0))
    first = await embedded.prepare(settings, clock)
    clock.advance(60)
    assert (await embedded.prepare(settings, clock)) == first  # a restart

    db = Database(settings.database_url)
    try:
        async with db.read() as session:
            available = await ledger.balance(session, ledger.tenant_balance(first.tenant_id))
            top_ups = await session.scalar(
                select(func.count()).where(
                    LedgerTransactionRow.kind == TransactionKind.TOP_UP.value
                )
            )
    finally:
        await db.dispose()
    assert available == embedded.DEMO_TOP_UP.amount == 100_000_000
    assert top_ups == 1


async def test_free_billing_gives_no_demo_money_and_no_price(settings: Settings) -> None:
    settings = demo(settings).model_copy(update={"billing": BillingMode.FREE})
    clock = FrozenClock(datetime.now(UTC).replace(microsecond=0))
    creds = await embedded.prepare(settings, clock)
    assert await embedded.price_local_node(settings, clock, creds.enrollment_token) == []
    db = Database(settings.database_url)
    try:
        async with db.read() as session:
            assert await ledger.balance(session, ledger.tenant_balance(creds.tenant_id)) == 0
    finally:
        await db.dispose()


async def test_the_first_invoke_is_charged_at_the_demo_price_and_shows_on_usage_and_earnings(
    settings: Settings,
) -> None:
    settings = demo(settings)
    clock = FrozenClock(datetime.now(UTC).replace(microsecond=0))
    creds = await embedded.prepare(settings, clock)
    app = create_app(settings, clock=clock)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://testserver"
        ) as http,
    ):
        agent = SimulatedAgent(
            "http://testserver", transport=httpx.ASGITransport(app=app), node_inventory=inventory()
        )
        await agent.register(creds.enrollment_token)
        assert await embedded.price_local_node(settings, clock, creds.enrollment_token) == ["cpu"]
        # Set once: a restart (or a price the owner changed) is kept.
        assert await embedded.price_local_node(settings, clock, creds.enrollment_token) == []

        submitted = await http.post(
            "/v1/gpu/invoke",
            json={**HELLO_WORLD, "runtime": "onnx_cpu", "timeout_sec": 60},
            headers=bearer(creds.tenant_key),
        )
        assert submitted.status_code == 202, submitted.text
        (job,) = await agent.lease()
        await agent.client.start(job.invoke_id, job.lease_token)
        clock.advance(36)  # 36 s at 0.5 USDC/h
        await agent.client.report(job.invoke_id, done_report(job), retry_for=0)
        done = await http.get(f"/v1/gpu/invokes/{job.invoke_id}", headers=bearer(creds.tenant_key))
        assert done.json()["cost"] == "0.005"
        await agent.aclose()

        await sign_in(http, creds.tenant_key)
        usage = await http.get("/console/usage")
        assert usage.status_code == 200
        assert 'id="demo-money"' in usage.text  # said plainly on every console page
        assert "99.995 <span" in usage.text  # the demo balance less the charge
        assert job.invoke_id in usage.text and "0.5 USDC/h" in usage.text

        provider_key = creds.provider_key
        assert provider_key is not None
        await http.post(
            "/signout", data={"csrf": re.findall(r'name="csrf" value="([^"]+)"', usage.text)[0]}
        )
        await sign_in(http, provider_key)
        earned = await http.get("/provider/earnings")
        assert earned.status_code == 200
        assert 'id="demo-money"' in earned.text
        held = re.search(r'id="held">([^<]*)<', earned.text)
        assert held is not None and held[1].strip() == "0.00425"  # 0.005 less 15 % commission
        assert "invoke · onnx_cpu" in earned.text and "sim-node" in earned.text


async def test_a_credentials_file_from_before_the_provider_key_gets_one_on_the_next_start(
    settings: Settings,
) -> None:
    clock = FrozenClock(datetime.now(UTC).replace(microsecond=0))
    first = await embedded.prepare(settings, clock)
    assert first.provider_key is not None and first.provider_key.startswith("gpu_pk_")
    path = embedded.credentials_path(settings)
    older = json.loads(path.read_text())
    del older["provider_key"]
    path.write_text(json.dumps(older))

    later = await embedded.prepare(settings, clock)
    assert (later.admin_key, later.tenant_key) == (first.admin_key, first.tenant_key)
    assert later.provider_key is not None and later.provider_key != first.provider_key
    assert json.loads(path.read_text())["provider_key"] == later.provider_key
    assert (await embedded.prepare(settings, clock)).provider_key == later.provider_key
