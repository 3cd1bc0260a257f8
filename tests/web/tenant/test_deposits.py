"""The "Top up with USDC" section of the tenant's Usage page: asking for a deposit, and
the transfer that arrives shown with its signature once credited."""

import re

import httpx
from fastapi import FastAPI
from solders.keypair import Keypair

from gpu_share.coordinator.loops import deposits as deposit_loop
from gpu_share.coordinator.services.money.solana.transfers import token_account
from gpu_share.testing.factories import TenantHandle
from gpu_share.testing.solana_rpc import SolanaNode
from tests.coordinator.services.money import test_deposits as on_chain
from tests.coordinator.services.money.test_deposits import MINT, PLATFORM, replica_of

# The node, the tenant's funded wallet and the settings that point the app at them.
node, chain, wallet, settings = on_chain.node, on_chain.chain, on_chain.wallet, on_chain.settings


async def sign_in(client: httpx.AsyncClient, key: str) -> str:
    form = await client.get("/signin")
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert csrf is not None
    done = await client.post("/signin", data={"csrf": csrf.group(1), "key": key})
    assert done.status_code == 303, done.text
    page = await client.get("/console/usage")
    token = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert token is not None
    return token.group(1)


async def test_a_tenant_asks_for_a_deposit_and_sees_it_arrive(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    chain: SolanaNode,
    wallet: Keypair,
) -> None:
    csrf = await sign_in(client, tenant.key)
    refused = await client.post(
        "/console/usage/deposits", data={"csrf": csrf, "amount": "1.2345678"}
    )
    assert refused.status_code == 303
    told = await client.get("/console/usage")
    assert "No deposit asked" in told.text and "six decimal places" in told.text
    assert 'class="deposits"' not in told.text  # nothing was asked

    asked = await client.post("/console/usage/deposits", data={"csrf": csrf, "amount": "12"})
    assert asked.status_code == 303
    page = (await client.get("/console/usage")).text
    assert str(token_account(PLATFORM, MINT)) in page
    reference = re.search(r"reference=([1-9A-HJ-NP-Za-km-z]{32,44})", page)
    assert reference is not None

    signature = chain.pay(wallet, PLATFORM, 12_000_000, reference.group(1))
    assert await deposit_loop.run_once(replica_of(app)) == [signature]
    arrived = (await client.get("/console/usage")).text
    assert signature in arrived and "12 USDC" in arrived
