"""Whatever crashes, drops, expiries, RPC errors and slow finality come in whatever
order, a USDC payout sent on Solana lands at most once, for exactly its amount, and
ends paid (landed) or failed (nothing landed) with the books balanced. On SQLite and
PostgreSQL, against the test node's JSON-RPC app (in process, so examples are fast)."""

import asyncio
import itertools
from datetime import UTC, datetime

import httpx
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from solders.keypair import Keypair
from solders.pubkey import Pubkey

from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.ids import new_id
from gpu_share.coordinator.core.orm import PayoutRow, ProviderRow
from gpu_share.coordinator.services.money import chain_sending, ledger, payouts
from gpu_share.coordinator.services.money.chain_payouts import Limits
from gpu_share.coordinator.services.money.chain_sending import ChainSetup
from gpu_share.coordinator.services.money.solana.keys import PayoutKey
from gpu_share.coordinator.services.money.solana.rpc import SolanaRpc
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.earnings import post_charge
from gpu_share.testing.solana_rpc import SolanaNode

MINT = Pubkey.from_string("EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v")
CLAIM_SEC = 60.0
T0 = datetime(2026, 12, 1, 9, tzinfo=UTC)


class Crash(BaseException):
    """The process dies here."""


class MortalRpc(SolanaRpc):
    """Dies before or after its next send when told to."""

    crash: str | None = None

    async def send_transaction(self, transaction: bytes) -> str:
        crash, self.crash = self.crash, None
        if crash == "before_send":
            raise Crash
        signature = await super().send_transaction(transaction)
        if crash == "after_send":
            raise Crash
        return signature


steps = st.lists(
    st.one_of(
        st.just(("run",)),
        st.tuples(st.just("crash"), st.sampled_from(["before_send", "after_send"])),
        st.tuples(st.just("drop"), st.integers(1, 3)),
        st.tuples(st.just("delay"), st.integers(1, 2)),
        st.just(("deliver",)),
        st.just(("expire",)),
        st.tuples(st.just("errors"), st.integers(1, 4)),
        st.just(("slow_finality",)),
        st.just(("finalize",)),
        st.just(("fail_on_chain",)),
    ),
    min_size=1,
    max_size=12,
)
_run = itertools.count()


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sequence=steps)
@example(sequence=[("delay", 1), ("run",), ("run",), ("deliver",)])  # late landing
@example(sequence=[("crash", "before_send"), ("run",), ("expire",), ("run",)])
@example(sequence=[("crash", "after_send"), ("drop", 1), ("run",)])
@example(sequence=[("drop", 2), ("run",), ("run",), ("expire",), ("run",)])
@example(sequence=[("slow_finality",), ("run",), ("run",), ("expire",), ("run",)])
def test_any_sequence_of_failures_lands_a_payout_at_most_once_and_keeps_the_books(
    db_url: str, sequence: list[tuple[object, ...]]
) -> None:
    asyncio.run(_check(db_url, sequence, next(_run)))


async def _payout(db: Database, clock: FrozenClock, wallet: Pubkey, amount: int) -> str:
    provider_id = new_id("prv")
    async with db.write() as session:
        session.add(
            ProviderRow(
                id=provider_id,
                name="Chain Farm",
                email="chain@example.com",
                tier="standard",
                created_at=clock.now(),
                payout_method={"kind": "solana_usdc", "address": str(wallet)},
            )
        )
    await post_charge(db, provider_id, at=clock.now(), provider_micro=amount)
    async with db.write() as session:
        made = await payouts.pay_out_now(session, provider_id, amount, clock.now(), "http://x")
    return made.id


async def _check(url: str, sequence: list[tuple[object, ...]], run: int) -> None:
    db = Database(url)
    clock = FrozenClock(T0)
    key = Keypair()
    node = SolanaNode(MINT)
    node.fund(key.pubkey(), 10**12)
    wallet = Keypair().pubkey()
    amount = 1_000_000 + run
    transport = httpx.ASGITransport(app=node.app())
    rpc = MortalRpc("http://solana.test/", attempts=2, retry_first_sec=0, transport=transport)
    setup = ChainSetup(
        rpc=rpc,
        key=PayoutKey(key),
        mint=MINT,
        limits=Limits(10**12, 10**13),
        claim_sec=CLAIM_SEC,
        base_url="http://x",
    )

    async def step() -> None:
        try:
            await chain_sending.run(db, clock, setup)
        except Crash:
            clock.advance(CLAIM_SEC + 1)  # a new process, once the dead one's claim ends

    try:
        payout_id = await _payout(db, clock, wallet, amount)
        for event in sequence:
            match event:
                case ("run",):
                    await step()
                case ("crash", str(where)):
                    rpc.crash = where
                    await step()
                case ("drop", int(n)):
                    node.drop_next += n
                case ("delay", int(n)):
                    node.delay_next += n
                case ("deliver",):
                    node.deliver()
                case ("expire",):
                    node.expire()
                case ("errors", int(n)):
                    node.errors.extend(["http500"] * n)
                case ("slow_finality",):
                    node.land_as = "confirmed"
                case ("finalize",):
                    node.finalize()
                    node.land_as = "finalized"
                case ("fail_on_chain",):
                    node.fail_next_on_chain = 1
            assert sum(t.amount_micro for t in node.received(wallet)) in (0, amount)
        # Then the chain behaves: the payout must settle.
        node.drop_next = node.delay_next = node.fail_next_on_chain = 0
        node.deliver()
        node.errors.clear()
        node.land_as = "finalized"
        for _ in range(6):
            node.finalize()
            rpc.crash = None
            await step()
            node.expire()
        async with db.read() as session:
            row = await session.get(PayoutRow, payout_id)
            assert row is not None
            landed = node.received(wallet)
            if row.status == "paid":
                assert [(t.signature, t.amount_micro) for t in landed] == [(row.reference, amount)]
            else:
                assert row.status == "failed" and landed == []
            assert await ledger.books_total(session) == (0, 0)
            in_transit = ledger.payouts_in_transit(row.provider_id)
            assert await ledger.balance(session, in_transit) == 0
    finally:
        await rpc.aclose()
        await db.dispose()
