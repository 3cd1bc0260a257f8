"""The Solana JSON-RPC client against the test node over loopback: answers read, the
node's "try again" errors and HTTP failures retried then reported as unavailable, and
what the node refuses reported with its code and message."""

from collections.abc import AsyncIterator

import pytest
from solders.keypair import Keypair
from solders.pubkey import Pubkey

from gpu_share.coordinator.services.money.solana import transfers
from gpu_share.coordinator.services.money.solana.rpc import RpcRejected, RpcUnavailable, SolanaRpc
from gpu_share.testing.solana_rpc import SolanaNode, solana_node

MINT = Pubkey.from_string("EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v")


@pytest.fixture
async def node() -> AsyncIterator[tuple[SolanaNode, SolanaRpc]]:
    async with solana_node(MINT) as (chain, url), SolanaRpc(url, retry_first_sec=0) as rpc:
        yield chain, rpc


async def test_the_client_reads_blockhashes_heights_accounts_and_statuses(
    node: tuple[SolanaNode, SolanaRpc],
) -> None:
    chain, rpc = node
    blockhash = await rpc.latest_blockhash()
    height = await rpc.block_height()
    assert blockhash.last_valid_block_height == height + 150
    owner = Keypair().pubkey()
    assert not await rpc.account_exists(str(transfers.token_account(owner, MINT)))
    chain.fund(owner, 1)
    assert await rpc.account_exists(str(transfers.token_account(owner, MINT)))
    assert await rpc.signature_status("1" * 64) is None


async def test_errors_worth_retrying_are_retried_then_reported(
    node: tuple[SolanaNode, SolanaRpc],
) -> None:
    chain, rpc = node
    chain.errors.extend(["http500", "behind"])
    assert await rpc.block_height() == chain.block_height  # the third attempt
    chain.errors.extend(["behind"] * 3)
    with pytest.raises(RpcUnavailable, match="getBlockHeight failed 3 times: Node is behind"):
        await rpc.block_height()


async def test_what_the_node_refuses_is_rejected_with_its_code(
    node: tuple[SolanaNode, SolanaRpc],
) -> None:
    _chain, rpc = node
    with pytest.raises(RpcRejected) as refused:
        await rpc.send_transaction(b"not a transaction")
    assert refused.value.code == -32602
    with pytest.raises(RpcRejected, match="Method not found"):
        await rpc.call("getSlotLeaderSchedule", [])


async def test_an_unreachable_node_is_unavailable() -> None:
    async with SolanaRpc("http://127.0.0.1:9/", attempts=2, retry_first_sec=0) as rpc:
        with pytest.raises(RpcUnavailable, match="2 times"):
            await rpc.block_height()
