"""Whatever mix of transfers (right, of another token, to another account, failed on
chain), slow finality, RPC errors, crashes and concurrent runs, a deposit credits its
tenant exactly what the platform's account received from each finalized transfer, once,
and the books balance. On SQLite and PostgreSQL, against the test node's JSON-RPC app
(in process, so examples are fast)."""

import asyncio
import contextlib
import itertools
from datetime import UTC, datetime

import httpx
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from solders.keypair import Keypair
from solders.pubkey import Pubkey
from sqlalchemy import func, select

from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.ids import new_id
from gpu_share.coordinator.core.orm import LedgerTransactionRow, TenantRow
from gpu_share.coordinator.services.money import deposit_watch, deposits, ledger
from gpu_share.coordinator.services.money.deposits import DepositTarget
from gpu_share.coordinator.services.money.solana.rpc import SolanaRpc
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.solana_rpc import SolanaNode

MINT = Pubkey.from_string("EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v")
OTHER_MINT = Keypair().pubkey()
T0 = datetime(2026, 12, 1, 9, tzinfo=UTC)


class Crash(BaseException):
    """The process dies here."""


class MortalRpc(SolanaRpc):
    crash_next = False

    async def transaction(self, signature: str) -> dict[str, object] | None:
        if self.crash_next:
            self.crash_next = False
            raise Crash
        return await super().transaction(signature)


steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("pay"),
            st.integers(1, 5_000_000),
            st.sampled_from(["usdc", "usdc", "other_mint", "other_account", "fails"]),
        ),
        st.just(("run",)),
        st.just(("two_runs",)),
        st.just(("crash",)),
        st.tuples(st.just("errors"), st.integers(1, 3)),
        st.just(("slow",)),
        st.just(("finalize",)),
    ),
    min_size=1,
    max_size=12,
)
_run = itertools.count()


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sequence=steps)
@example(sequence=[("pay", 7, "usdc"), ("two_runs",), ("crash",), ("run",)])
@example(sequence=[("pay", 7, "usdc"), ("crash",), ("pay", 3, "other_mint"), ("run",)])
def test_each_finalized_transfer_is_credited_once_with_what_arrived(
    db_url: str, sequence: list[tuple[object, ...]]
) -> None:
    asyncio.run(_check(db_url, sequence, next(_run)))


async def _check(url: str, sequence: list[tuple[object, ...]], run: int) -> None:
    db = Database(url)
    clock = FrozenClock(T0)
    node = SolanaNode(MINT)
    platform, payer, someone = Keypair().pubkey(), Keypair(), Keypair().pubkey()
    node.fund(platform, 0)
    node.fund(platform, 0, mint=OTHER_MINT)
    node.fund(someone, 0)
    node.fund(payer.pubkey(), 10**12)
    node.fund(payer.pubkey(), 10**12, mint=OTHER_MINT)
    target = DepositTarget(platform, MINT, 3600.0)
    transport = httpx.ASGITransport(app=node.app())
    rpc = MortalRpc("http://solana.test/", attempts=2, retry_first_sec=0, transport=transport)
    tenant_id = new_id("ten")
    expected = 0
    expected_count = 0

    async def watch() -> None:
        with contextlib.suppress(Crash):
            await deposit_watch.run(db, clock, rpc, target)

    try:
        async with db.write() as session:
            session.add(TenantRow(id=tenant_id, name="t", email="t@example.com", created_at=T0))
            await session.flush()
            asked = await deposits.request(session, tenant_id, None, target, clock.now())
        for event in sequence:
            match event:
                case ("pay", int(amount), str(kind)):
                    if kind == "fails":
                        node.fail_next_on_chain = 1
                    mint = OTHER_MINT if kind == "other_mint" else MINT
                    to = someone if kind == "other_account" else platform
                    node.pay(payer, to, amount, asked.reference, mint=mint)
                    if kind == "usdc":
                        expected += amount
                        expected_count += 1
                case ("run",):
                    await watch()
                case ("two_runs",):
                    await asyncio.gather(watch(), watch())
                case ("crash",):
                    rpc.crash_next = True
                    await watch()
                case ("errors", int(n)):
                    node.errors.extend(["http500"] * n)
                case ("slow",):
                    node.land_as = "confirmed"
                case ("finalize",):
                    node.finalize()
                    node.land_as = "finalized"
            async with db.read() as session:
                credited = await ledger.balance(session, ledger.tenant_balance(tenant_id))
                assert 0 <= credited <= expected
        node.errors.clear()
        node.finalize()
        rpc.crash_next = False
        await watch()
        async with db.read() as session:
            assert await ledger.balance(session, ledger.tenant_balance(tenant_id)) == expected
            count = await session.scalar(
                select(func.count()).where(
                    LedgerTransactionRow.cause.startswith("deposit:"),
                    LedgerTransactionRow.details["tenant_id"].as_string() == tenant_id,
                )
            )
            assert count == expected_count
            assert await ledger.books_total(session) == (0, 0)
    finally:
        await rpc.aclose()
        await db.dispose()
