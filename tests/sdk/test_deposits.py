"""The SDK's USDC top-ups against the real coordinator in-process and a real Solana
JSON-RPC node on loopback: a deposit request, the transfer naming its reference
credited, the list showing it; a platform without top-ups refuses as `Conflict`."""

from collections.abc import AsyncIterator

import pytest
from fastapi import FastAPI
from pydantic import SecretStr
from solders.keypair import Keypair
from solders.pubkey import Pubkey

from gpu_share import AsyncClient, Conflict, ValidationError
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.loops import deposits as deposit_loop
from gpu_share.protocol.deposits import Deposit
from gpu_share.testing.solana_rpc import SolanaNode, solana_node

MINT = Pubkey.from_string("EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v")
PLATFORM = Keypair().pubkey()  # the deposit wallet: only its public key is configured


@pytest.fixture
async def node() -> AsyncIterator[tuple[SolanaNode, str]]:
    async with solana_node(MINT) as (chain, url):
        chain.fund(PLATFORM, 0)
        yield chain, url


@pytest.fixture
def settings(settings: Settings, request: pytest.FixtureRequest) -> Settings:
    """Top-ups are set up for the tests that ask for the node, and only for those."""
    if "node" in request.fixturenames:
        _, url = request.getfixturevalue("node")
        settings.solana_rpc_url = SecretStr(url)
        settings.solana_deposit_wallet = str(PLATFORM)
        settings.solana_rpc_retry_first_sec = 0
    return settings


async def test_a_deposit_is_requested_paid_and_listed_as_credited_through_the_sdk(
    app: FastAPI, sdk: AsyncClient, node: tuple[SolanaNode, str]
) -> None:
    chain, _ = node
    wallet = Keypair()
    chain.fund(wallet.pubkey(), 100_000_000)
    before = (await sdk.balance()).available

    asked = await sdk.request_deposit("25")
    assert isinstance(asked, Deposit)
    assert (asked.wallet, asked.mint, asked.amount, asked.received) == (
        str(PLATFORM),
        str(MINT),
        "25",
        "0",
    )
    assert f"reference={asked.reference}" in asked.solana_pay_url
    unnamed = await sdk.request_deposit()
    assert unnamed.amount is None and unnamed.reference != asked.reference

    signature = chain.pay(wallet, PLATFORM, 25_000_000, asked.reference)
    assert await deposit_loop.run_once(app.state.replica) == [signature]
    listed = await sdk.deposits()
    assert [d.id for d in listed] == [unnamed.id, asked.id]  # newest first
    assert listed[1].received == "25"
    assert [(a.signature, a.amount) for a in listed[1].arrivals] == [(signature, "25")]
    assert (before, (await sdk.balance()).available) == ("0", "25")

    with pytest.raises(ValidationError, match="amount"):
        await sdk.request_deposit("-1")  # refused before it is sent
    assert len(await sdk.deposits()) == 2


async def test_without_usdc_top_ups_a_deposit_request_is_a_conflict(sdk: AsyncClient) -> None:
    with pytest.raises(Conflict, match="not set up") as refused:
        await sdk.request_deposit()
    assert refused.value.status == 409
    assert await sdk.deposits() == []
