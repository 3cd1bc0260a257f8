"""Tenants' USDC top-ups on Solana, on SQLite and PostgreSQL, against a real JSON-RPC
node on loopback: a deposit request, each finalized transfer naming its reference
credited once with what arrived, and what is not credited (another token, another
account, a failed or unfinalized transfer, a second attempt)."""

from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pydantic import SecretStr
from solders.keypair import Keypair
from solders.pubkey import Pubkey
from sqlalchemy import func, select

from gpu_share.coordinator.core.orm import LedgerTransactionRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.loops import deposits as deposit_loop
from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.money import deposits, ledger
from gpu_share.coordinator.services.money.solana.transfers import token_account
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import TEST_ADMIN_KEY, TenantHandle
from gpu_share.testing.solana_rpc import SolanaNode, solana_node

MINT = Pubkey.from_string("EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v")
PLATFORM = Keypair().pubkey()  # the deposit wallet: only its public key is configured


@pytest.fixture
async def node() -> AsyncIterator[tuple[SolanaNode, str]]:
    async with solana_node(MINT) as (chain, url):
        chain.fund(PLATFORM, 0)
        yield chain, url


@pytest.fixture
def chain(node: tuple[SolanaNode, str]) -> SolanaNode:
    return node[0]


@pytest.fixture
def settings(db_url: str, tmp_path: Path, node: tuple[SolanaNode, str]) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        database_url=db_url,
        admin_key=SecretStr(TEST_ADMIN_KEY),
        run_background_loops=False,
        solana_rpc_url=node[1],
        solana_deposit_wallet=str(PLATFORM),
        solana_rpc_retry_first_sec=0,
    )


@pytest.fixture
def wallet(chain: SolanaNode) -> Keypair:
    """The tenant's wallet, holding 1,000 USDC."""
    payer = Keypair()
    chain.fund(payer.pubkey(), 1_000_000_000)
    return payer


def replica_of(app: FastAPI) -> Replica:
    replica: Replica = app.state.replica
    return replica


async def ask(client: httpx.AsyncClient, tenant: TenantHandle, **body: str) -> dict[str, Any]:
    made = await client.post("/v1/billing/deposits", json=body, headers=tenant.headers)
    assert made.status_code == 201, made.text
    answer: dict[str, Any] = made.json()
    return answer


async def balance(app: FastAPI, tenant: TenantHandle) -> int:
    async with replica_of(app).db.read() as session:
        return await ledger.balance(session, ledger.tenant_balance(tenant.id))


async def test_a_deposit_says_where_to_send_and_the_transfer_is_credited_once(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    chain: SolanaNode,
    wallet: Keypair,
    clock: FrozenClock,
) -> None:
    asked = await ask(client, tenant, amount="25")
    assert asked["address"] == str(token_account(PLATFORM, MINT))
    assert asked["wallet"] == str(PLATFORM) and asked["mint"] == str(MINT)
    assert Pubkey.from_string(asked["reference"]) != PLATFORM
    assert asked["solana_pay_url"].startswith(f"solana:{PLATFORM}?amount=25&spl-token={MINT}")
    assert f"reference={asked['reference']}" in asked["solana_pay_url"]
    assert asked["received"] == "0" and asked["arrivals"] == []
    other = await ask(client, tenant)
    assert other["reference"] != asked["reference"] and other["amount"] is None

    before = await balance(app, tenant)
    signature = chain.pay(wallet, PLATFORM, 25_000_000, asked["reference"])
    assert await deposit_loop.run_once(replica_of(app)) == [signature]
    assert await balance(app, tenant) == before + 25_000_000
    assert await deposit_loop.run_once(replica_of(app)) == []  # seen again: nothing more
    assert await balance(app, tenant) == before + 25_000_000

    listed = (await client.get("/v1/billing/deposits", headers=tenant.headers)).json()
    [shown] = [d for d in listed if d["id"] == asked["id"]]
    assert shown["received"] == "25"
    assert [(a["signature"], a["amount"]) for a in shown["arrivals"]] == [(signature, "25")]
    async with replica_of(app).db.read() as session:
        assert await ledger.books_total(session) == (0, 0)
        again = await deposits.credit(session, asked["id"], signature, 25_000_000, clock.now())
        assert again is False  # a second credit of the same transfer changes nothing
        causes = await session.scalar(
            select(func.count()).where(LedgerTransactionRow.cause == f"deposit:{signature}")
        )
        assert causes == 1


async def test_a_partial_amount_is_credited_as_received_and_each_transfer_counts(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    chain: SolanaNode,
    wallet: Keypair,
) -> None:
    asked = await ask(client, tenant, amount="50")
    before = await balance(app, tenant)
    first = chain.pay(wallet, PLATFORM, 20_000_000, asked["reference"])
    second = chain.pay(wallet, PLATFORM, 1, asked["reference"])
    assert sorted(await deposit_loop.run_once(replica_of(app))) == sorted([first, second])
    assert await balance(app, tenant) == before + 20_000_001


async def test_another_token_another_account_a_failed_or_unfinalized_transfer_is_not_credited(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    chain: SolanaNode,
    wallet: Keypair,
) -> None:
    asked = await ask(client, tenant)
    reference = asked["reference"]
    before = await balance(app, tenant)
    fake = Keypair().pubkey()
    chain.fund(wallet.pubkey(), 10**9, mint=fake)
    chain.fund(PLATFORM, 0, mint=fake)
    chain.pay(wallet, PLATFORM, 5_000_000, reference, mint=fake)  # another token
    someone = Keypair().pubkey()
    chain.fund(someone, 0)
    chain.pay(wallet, someone, 5_000_000, reference)  # USDC, to another account
    chain.fail_next_on_chain = 1
    chain.pay(wallet, PLATFORM, 5_000_000, reference)  # failed on chain
    assert await deposit_loop.run_once(replica_of(app)) == []
    assert await balance(app, tenant) == before

    chain.land_as = "confirmed"
    pending = chain.pay(wallet, PLATFORM, 3_000_000, reference)
    assert await deposit_loop.run_once(replica_of(app)) == []  # not final yet
    chain.finalize()
    assert await deposit_loop.run_once(replica_of(app)) == [pending]
    assert await balance(app, tenant) == before + 3_000_000


async def test_rpc_errors_leave_a_transfer_for_the_next_run(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    chain: SolanaNode,
    wallet: Keypair,
) -> None:
    asked = await ask(client, tenant)
    signature = chain.pay(wallet, PLATFORM, 2_000_000, asked["reference"])
    chain.errors.extend(["http500"] * 3)
    assert await deposit_loop.run_once(replica_of(app)) == []
    assert await deposit_loop.run_once(replica_of(app)) == [signature]


async def test_an_expired_request_is_no_longer_watched(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    chain: SolanaNode,
    wallet: Keypair,
    clock: FrozenClock,
) -> None:
    asked = await ask(client, tenant)
    ttl = replica_of(app).settings.solana_deposit_ttl_sec
    assert datetime.fromisoformat(asked["expires_at"]) == clock.now() + timedelta(seconds=ttl)
    before = await balance(app, tenant)
    clock.advance(ttl + 1)
    chain.pay(wallet, PLATFORM, 2_000_000, asked["reference"])
    assert await deposit_loop.run_once(replica_of(app)) == []
    assert await balance(app, tenant) == before


async def test_a_tenant_sees_only_its_own_deposits_and_bad_amounts_are_refused(
    client: httpx.AsyncClient, tenant: TenantHandle, other_tenant: TenantHandle
) -> None:
    mine = await ask(client, tenant)
    theirs = (await client.get("/v1/billing/deposits", headers=other_tenant.headers)).json()
    assert theirs == []
    refused = await client.post(
        "/v1/billing/deposits", json={"amount": "-1"}, headers=tenant.headers
    )
    assert refused.status_code == 422
    assert refused.json()["error"]["code"] == "VALIDATION_ERROR"
    listed = (await client.get("/v1/billing/deposits", headers=tenant.headers)).json()
    assert [d["id"] for d in listed] == [mine["id"]]


async def test_without_a_deposit_wallet_top_ups_are_not_offered(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    replica = replica_of(app)
    replica.settings = replica.settings.model_copy(update={"solana_deposit_wallet": None})
    refused = await client.post("/v1/billing/deposits", headers=tenant.headers)
    assert refused.status_code == 409
    assert "not set up" in refused.json()["error"]["message"]
    assert await deposit_loop.run_once(replica) == []


async def test_a_tenant_keeps_a_few_requests_open_at_once(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    other_tenant: TenantHandle,
    clock: FrozenClock,
) -> None:
    first = await ask(client, tenant)
    for _ in range(deposits.MAX_OPEN - 1):
        await ask(client, tenant)
    refused = await client.post("/v1/billing/deposits", json={}, headers=tenant.headers)
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    next_expiry = datetime.fromisoformat(error["details"]["next_expiry"])
    assert next_expiry == datetime.fromisoformat(first["expires_at"])
    assert "send to one of them" in error["message"]
    await ask(client, other_tenant)  # another tenant's requests are its own
    clock.advance(replica_of(app).settings.solana_deposit_ttl_sec + 1)
    await ask(client, tenant)  # the oldest expired: room again
