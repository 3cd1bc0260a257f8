"""USDC payouts the platform sends on Solana, on SQLite and PostgreSQL, against a real
JSON-RPC node on loopback that checks each transaction with solders
(`gpu_share.testing.solana_rpc`): to finalized, the provider's account created when
missing, a crash between recording and sending, dropped transactions, expired
blockhashes, RPC errors, on-chain failures and refusals, limits and approval, two
replicas at once."""

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pydantic import SecretStr
from solders.keypair import Keypair
from solders.pubkey import Pubkey
from solders.transaction import Transaction
from sqlalchemy import select

from gpu_share.coordinator.core.orm import ChainPayoutRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.loops import chain_payouts as chain_loop
from gpu_share.coordinator.loops import payouts as payout_loop
from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.money import chain_sending, ledger
from gpu_share.coordinator.services.money.chain_sending import ChainSetup, Outcome
from gpu_share.coordinator.services.money.solana import transfers
from gpu_share.coordinator.services.money.solana.rpc import SolanaRpc
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.earnings import move_to, post_charge
from gpu_share.testing.factories import ADMIN, TEST_ADMIN_KEY, ProviderHandle
from gpu_share.testing.solana_rpc import SolanaNode, solana_node

MINT = Pubkey.from_string("EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v")
PLATFORM_FUNDS = 1_000_000_000_000
EXPLORER = "https://explorer.solana.com/tx/{signature}?cluster=devnet"


@pytest.fixture
def payout_key() -> Keypair:
    return Keypair()


@pytest.fixture
async def node(payout_key: Keypair) -> AsyncIterator[tuple[SolanaNode, str]]:
    async with solana_node(MINT) as (chain, url):
        chain.fund(payout_key.pubkey(), PLATFORM_FUNDS)
        yield chain, url


@pytest.fixture
def chain(node: tuple[SolanaNode, str]) -> SolanaNode:
    return node[0]


@pytest.fixture
def settings(
    db_url: str, tmp_path: Path, node: tuple[SolanaNode, str], payout_key: Keypair
) -> Settings:
    key_file = tmp_path / "payout-keypair.json"
    key_file.write_text(json.dumps(list(bytes(payout_key))))
    return Settings(
        data_dir=tmp_path / "data",
        database_url=db_url,
        admin_key=SecretStr(TEST_ADMIN_KEY),
        run_background_loops=False,
        solana_rpc_url=node[1],
        solana_payout_keypair_path=key_file,
        solana_rpc_retry_first_sec=0,
        solana_explorer_url=EXPLORER,
        solana_payout_max_micro=500_000_000,
        solana_payout_daily_max_micro=800_000_000,
    )


def replica_of(app: FastAPI) -> Replica:
    replica: Replica = app.state.replica
    return replica


def auth(handle: ProviderHandle) -> dict[str, str]:
    return {"Authorization": f"Bearer {handle.key}"}


async def make_payout(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, amount: int
) -> tuple[str, Pubkey]:
    """A manual payout of `amount` micro-USDC to a fresh wallet: its id and the wallet."""
    wallet = Keypair().pubkey()
    method = {"kind": "solana_usdc", "address": str(wallet)}
    saved = await client.put(
        "/v1/provider/payout-settings", json={"method": method}, headers=auth(provider)
    )
    assert saved.status_code == 200, saved.text
    db = replica_of(app).db
    await post_charge(db, provider.id, at=replica_of(app).clock.now(), provider_micro=amount)
    made = await client.post(
        f"/v1/admin/providers/{provider.id}/payouts",
        json={"amount": str(amount / 1_000_000)},
        headers=ADMIN,
    )
    assert made.status_code == 201, made.text
    return made.json()["id"], wallet


async def run(app: FastAPI) -> dict[str, Outcome]:
    return await chain_loop.run_once(replica_of(app))


async def chain_row(app: FastAPI, payout_id: str) -> ChainPayoutRow:
    async with replica_of(app).db.read() as session:
        row = await session.get(ChainPayoutRow, payout_id)
        assert row is not None
        return row


async def payout_of(client: httpx.AsyncClient, provider: ProviderHandle, pid: str) -> Any:
    listed = (await client.get("/v1/provider/payouts", headers=auth(provider))).json()
    [found] = [p for p in listed if p["id"] == pid]
    return found


async def assert_books(app: FastAPI, provider_id: str, pending: int, in_transit: int) -> None:
    async with replica_of(app).db.read() as session:
        assert await ledger.books_total(session) == (0, 0)
        assert await ledger.balance(session, ledger.provider_pending(provider_id)) == pending
        assert await ledger.balance(session, ledger.payouts_in_transit(provider_id)) == in_transit


# ---- to finalized -------------------------------------------------------------------


async def test_a_payout_is_signed_sent_and_paid_once_finalized_with_an_explorer_link(
    app: FastAPI,
    client: httpx.AsyncClient,
    provider: ProviderHandle,
    chain: SolanaNode,
    payout_key: Keypair,
) -> None:
    pid, wallet = await make_payout(app, client, provider, 12_345_678)
    assert chain.balance(wallet) is None  # the provider has no USDC account yet

    assert await run(app) == {pid: Outcome.SENT}
    row = await chain_row(app, pid)
    assert row.state == "sending" and row.signature and row.builds == 1
    sent = Transaction.from_bytes(base64.b64decode(row.transaction or ""))
    sent.verify()
    assert sent.message.account_keys[0] == payout_key.pubkey()  # the payout key pays the fee
    programs = [sent.message.account_keys[i.program_id_index] for i in sent.message.instructions]
    assert programs == [
        transfers.ASSOCIATED_TOKEN_PROGRAM,  # the missing account, created
        transfers.TOKEN_PROGRAM,
        transfers.MEMO_PROGRAM,
    ]
    assert chain.balance(wallet) == 12_345_678  # exact micro-USDC
    assert chain.balance(payout_key.pubkey()) == PLATFORM_FUNDS - 12_345_678
    [landed] = chain.transfers
    assert landed.signature == row.signature and landed.memo == pid
    assert (await payout_of(client, provider, pid))["status"] == "in_transit"

    assert await run(app) == {pid: Outcome.PAID}
    shown = await payout_of(client, provider, pid)
    assert shown["status"] == "paid" and shown["reference"] == row.signature
    assert shown["chain_state"] == "finalized" and shown["signature"] == row.signature
    assert shown["explorer_url"] == EXPLORER.replace("{signature}", row.signature)
    await assert_books(app, provider.id, pending=0, in_transit=0)

    assert await run(app) == {}  # nothing more is sent
    assert len(chain.transfers) == 1 and chain.sent == [row.signature]


async def test_an_existing_token_account_is_paid_into_without_creating_one(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, chain: SolanaNode
) -> None:
    pid, wallet = await make_payout(app, client, provider, 2_000_000)
    chain.fund(wallet, 5)
    assert await run(app) == {pid: Outcome.SENT}
    row = await chain_row(app, pid)
    sent = Transaction.from_bytes(base64.b64decode(row.transaction or ""))
    assert len(sent.message.instructions) == 2  # TransferChecked and Memo only
    assert chain.balance(wallet) == 2_000_005


async def test_a_payout_seen_but_not_final_is_paid_only_once_finalized(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, chain: SolanaNode
) -> None:
    chain.land_as = "confirmed"
    pid, _ = await make_payout(app, client, provider, 3_000_000)
    assert await run(app) == {pid: Outcome.SENT}
    assert await run(app) == {pid: Outcome.LANDING}
    assert (await payout_of(client, provider, pid))["status"] == "in_transit"
    chain.finalize()
    assert await run(app) == {pid: Outcome.PAID}


# ---- crashes, drops, expiry, errors -------------------------------------------------


class Crash(BaseException):
    """The process dies here."""


class CrashBeforeSend(SolanaRpc):
    async def send_transaction(self, transaction: bytes) -> str:
        raise Crash


def setup_with(app: FastAPI, rpc: SolanaRpc) -> ChainSetup:
    setup = chain_sending.setup_from(replica_of(app).settings)
    assert setup is not None
    return ChainSetup(rpc, setup.key, setup.mint, setup.limits, setup.claim_sec, setup.base_url)


async def test_a_crash_between_recording_and_sending_resends_the_same_transaction(
    app: FastAPI,
    client: httpx.AsyncClient,
    provider: ProviderHandle,
    chain: SolanaNode,
    clock: FrozenClock,
    node: tuple[SolanaNode, str],
) -> None:
    pid, wallet = await make_payout(app, client, provider, 7_000_000)
    replica = replica_of(app)
    async with CrashBeforeSend(node[1], retry_first_sec=0) as dying:
        with pytest.raises(Crash):
            await chain_sending.run(replica.db, replica.clock, setup_with(app, dying))
    recorded = await chain_row(app, pid)
    assert recorded.signature and recorded.transaction  # committed before the send
    assert chain.sent == [] and chain.balance(wallet) is None

    clock.advance(replica.settings.solana_send_claim_sec + 1)  # the dead replica's claim ends
    assert await run(app) == {pid: Outcome.RESENT}
    assert chain.sent == [recorded.signature]  # the very transaction recorded
    assert await run(app) == {pid: Outcome.PAID}
    assert (await chain_row(app, pid)).builds == 1
    assert chain.balance(wallet) == 7_000_000 and len(chain.transfers) == 1


async def test_a_dropped_transaction_is_resent_and_rebuilt_only_once_its_blockhash_expired(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, chain: SolanaNode
) -> None:
    chain.drop_next = 2
    pid, wallet = await make_payout(app, client, provider, 4_000_000)
    assert await run(app) == {pid: Outcome.SENT}  # dropped
    first = (await chain_row(app, pid)).signature
    assert await run(app) == {pid: Outcome.RESENT}  # still valid: the same one, dropped again
    assert (await chain_row(app, pid)).signature == first

    chain.expire()
    assert await run(app) == {pid: Outcome.SENT}  # it can never land now: a new one
    row = await chain_row(app, pid)
    assert row.signature != first and row.builds == 2
    assert await run(app) == {pid: Outcome.PAID}
    assert [t.signature for t in chain.transfers] == [row.signature]
    assert chain.balance(wallet) == 4_000_000
    assert chain.sent == [first, first, row.signature]


async def test_rpc_errors_are_retried_and_a_run_that_cannot_reach_the_rpc_changes_nothing(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, chain: SolanaNode
) -> None:
    pid, wallet = await make_payout(app, client, provider, 1_500_000)
    chain.errors.extend(["http500", "behind"])
    assert await run(app) == {pid: Outcome.SENT}  # each call retried past its error
    assert chain.balance(wallet) == 1_500_000
    assert await run(app) == {pid: Outcome.PAID}

    other, _ = await make_payout(app, client, provider, 2_500_000)
    chain.errors.extend(["http500"] * 3)  # every attempt at one call
    assert await run(app) == {other: Outcome.RETRY}
    assert (await chain_row(app, other)).signature is None  # nothing signed, nothing sent
    assert await run(app) == {other: Outcome.SENT}


async def test_a_hanging_rpc_times_out_and_is_retried(
    app: FastAPI,
    client: httpx.AsyncClient,
    provider: ProviderHandle,
    chain: SolanaNode,
    node: tuple[SolanaNode, str],
) -> None:
    pid, wallet = await make_payout(app, client, provider, 1_000_000)
    chain.hang_sec = 0.3
    chain.errors.append("hang")
    replica = replica_of(app)
    async with SolanaRpc(node[1], timeout_sec=0.1, retry_first_sec=0) as quick:
        done = await chain_sending.run(replica.db, replica.clock, setup_with(app, quick))
    assert done == {pid: Outcome.SENT} and chain.balance(wallet) == 1_000_000


# ---- failures ---------------------------------------------------------------------------


async def test_a_transfer_that_fails_on_chain_fails_the_payout_and_returns_the_money(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, chain: SolanaNode
) -> None:
    chain.fail_next_on_chain = 1
    pid, wallet = await make_payout(app, client, provider, 6_000_000)
    assert await run(app) == {pid: Outcome.SENT}
    assert await run(app) == {pid: Outcome.FAILED}
    shown = await payout_of(client, provider, pid)
    assert shown["status"] == "failed" and "failed on Solana" in shown["failure_reason"]
    assert chain.balance(wallet) is None and chain.transfers == []
    await assert_books(app, provider.id, pending=6_000_000, in_transit=0)
    assert await run(app) == {}


async def test_a_transfer_the_rpc_refuses_fails_once_it_can_no_longer_land(
    app: FastAPI,
    client: httpx.AsyncClient,
    provider: ProviderHandle,
    chain: SolanaNode,
    payout_key: Keypair,
) -> None:
    chain.fund(payout_key.pubkey(), 1_000_000)  # the platform is short of USDC
    pid, _ = await make_payout(app, client, provider, 9_000_000)
    assert await run(app) == {pid: Outcome.REJECTED}
    assert await run(app) == {pid: Outcome.REJECTED}  # resent while it may still land
    chain.expire()
    assert await run(app) == {pid: Outcome.FAILED}
    shown = await payout_of(client, provider, pid)
    assert "insufficient funds" in shown["failure_reason"]
    await assert_books(app, provider.id, pending=9_000_000, in_transit=0)


async def test_a_payout_being_sent_cannot_be_settled_by_hand(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, chain: SolanaNode
) -> None:
    chain.drop_next = 1
    pid, _ = await make_payout(app, client, provider, 1_000_000)
    await run(app)
    refused = await client.post(
        f"/v1/admin/payouts/{pid}/failed", json={"reason": "paid by hand"}, headers=ADMIN
    )
    assert refused.status_code == 409, refused.text
    assert "being sent on Solana" in refused.json()["error"]["message"]
    assert (await payout_of(client, provider, pid))["status"] == "in_transit"


# ---- limits and approval --------------------------------------------------------------


async def test_a_payout_above_a_limit_waits_for_an_admin_and_is_sent_once_approved(
    app: FastAPI,
    client: httpx.AsyncClient,
    provider: ProviderHandle,
    chain: SolanaNode,
) -> None:
    big, big_wallet = await make_payout(app, client, provider, 500_000_001)  # above per payout
    assert await run(app) == {}
    assert (await payout_of(client, provider, big))["chain_state"] == "awaiting_approval"
    listed = (await client.get("/v1/admin/chain-payouts", headers=ADMIN)).json()
    assert [(c["payout_id"], c["state"]) for c in listed] == [(big, "awaiting_approval")]

    first, _ = await make_payout(app, client, provider, 500_000_000)
    second, _ = await make_payout(app, client, provider, 300_000_001)  # past 800 for the day
    assert await run(app) == {first: Outcome.SENT}
    assert (await chain_row(app, second)).state == "awaiting_approval"

    denied = await client.post(f"/v1/admin/payouts/{big}/approve", headers=auth(provider))
    assert denied.status_code == 403
    approved = await client.post(f"/v1/admin/payouts/{big}/approve", headers=ADMIN)
    assert approved.status_code == 204, approved.text
    again = await client.post(f"/v1/admin/payouts/{big}/approve", headers=ADMIN)
    assert again.status_code == 409 and "sending" in again.json()["error"]["message"]
    assert (await run(app))[big] == Outcome.SENT
    assert chain.balance(big_wallet) == 500_000_001
    assert chain.balance(Keypair().pubkey()) is None
    missing = await client.post("/v1/admin/payouts/pay_000000000000/approve", headers=ADMIN)
    assert missing.status_code in (404, 422)


# ---- replicas -------------------------------------------------------------------------


async def test_two_replicas_at_once_send_each_payout_once(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, chain: SolanaNode
) -> None:
    made = [await make_payout(app, client, provider, 1_000_000 + n) for n in range(3)]
    replica = replica_of(app)
    for _ in range(2):
        await asyncio.gather(chain_loop.run_once(replica), chain_loop.run_once(replica))
    for pid, wallet in made:
        assert chain.balance(wallet) == 1_000_000 + int(pid == made[1][0]) + 2 * int(
            pid == made[2][0]
        )
        assert (await payout_of(client, provider, pid))["status"] == "paid"
    assert len(chain.transfers) == 3 and len(chain.sent) == 3
    async with replica.db.read() as session:
        rows = (await session.scalars(select(ChainPayoutRow))).all()
        assert all(row.builds == 1 for row in rows)


# ---- the platform or an admin pays a payout, never both -------------------------------

MONDAY = datetime(2026, 12, 7, 0, 30, tzinfo=UTC)  # a weekly payout day (ISO week 2026-W50)


async def weekly_payout(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, clock: FrozenClock
) -> tuple[str, str]:
    """A scheduled USDC payout in a weekly batch: (payout id, batch id)."""
    wallet = Keypair().pubkey()
    saved = await client.put(
        "/v1/provider/payout-settings",
        json={"method": {"kind": "solana_usdc", "address": str(wallet)}, "schedule": "weekly"},
        headers=auth(provider),
    )
    assert saved.status_code == 200, saved.text
    await post_charge(
        replica_of(app).db,
        provider.id,
        at=datetime(2026, 12, 2, tzinfo=UTC),
        provider_micro=12_345_678,
    )
    move_to(clock, MONDAY)
    await payout_loop.run_once(replica_of(app))
    [batch] = (await client.get("/v1/admin/payout-batches", headers=ADMIN)).json()
    [payout] = (await client.get("/v1/provider/payouts", headers=auth(provider))).json()
    return payout["id"], batch["id"]


async def test_an_export_leaves_out_what_the_platform_is_sending(
    app: FastAPI,
    client: httpx.AsyncClient,
    provider: ProviderHandle,
    chain: SolanaNode,
    clock: FrozenClock,
) -> None:
    pid, batch_id = await weekly_payout(app, client, provider, clock)
    assert await run(app) == {pid: Outcome.SENT}
    exported = await client.get(
        f"/v1/admin/payout-batches/{batch_id}/export?format=json", headers=ADMIN
    )
    assert exported.status_code == 200, exported.text
    assert exported.json()["payouts"] == []  # nothing for an admin to pay a second time
    assert await run(app) == {pid: Outcome.PAID}  # the platform still finishes it
    assert len(chain.transfers) == 1


async def test_a_batch_an_admin_exported_is_not_sent_by_the_platform(
    app: FastAPI,
    client: httpx.AsyncClient,
    provider: ProviderHandle,
    chain: SolanaNode,
    clock: FrozenClock,
) -> None:
    pid, batch_id = await weekly_payout(app, client, provider, clock)
    exported = await client.get(
        f"/v1/admin/payout-batches/{batch_id}/export?format=json", headers=ADMIN
    )
    assert [p["payout_id"] for p in exported.json()["payouts"]] == [pid]
    assert await run(app) == {}  # the admin pays it by hand
    assert chain.transfers == [] and (await payout_of(client, provider, pid))["status"] == (
        "in_transit"
    )
