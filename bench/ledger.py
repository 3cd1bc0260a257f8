"""The ledger's cost (issue: money), on PostgreSQL.

(a) Posting one charge (`ledger.post`: four entries, the once-per-cause insert, guarded
    balance updates, all in a savepoint) in its own write transaction, against two bare
    INSERTs in one transaction through the same engine, interleaved in rounds. Target:
    ours / bare throughput ≥ 0.5.
(b) Settling 100,000 finished invokes with `billing.settle` (the step every final status
    change runs), one write transaction each, 32 concurrent writers; the time, and that
    the books still sum to zero with one charge per invoke.

Run: .venv/bin/python bench/ledger.py [--postings 2000] [--invokes 100000] [--writers 32]
"""

import argparse
import asyncio
import statistics
import time
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, insert, select, text

from gpu_share.coordinator import migrate
from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.ids import new_id
from gpu_share.coordinator.core.orm import (
    InvokeRow,
    LedgerEntryRow,
    LedgerTransactionRow,
    NodeRow,
    ProviderRow,
    TenantRow,
)
from gpu_share.coordinator.services.money import billing, ledger
from gpu_share.coordinator.services.money.billing import most_for, reserve_cause
from gpu_share.coordinator.services.money.ledger import (
    COMMISSION,
    WORLD,
    Entry,
    TransactionKind,
    provider_pending,
    split_commission,
    tenant_balance,
    tenant_reserved,
    transfer,
)
from gpu_share.testing.databases import create_scratch_postgres, drop_scratch_postgres

NOW = datetime.now(UTC)
TENANTS = [f"ten_bench{i:03d}" for i in range(50)]
PROVIDERS = [f"prv_bench{i:03d}" for i in range(20)]


def charge_entries(tenant: str, provider: str, reserved: int, cost: int) -> list[Entry]:
    earned, commission = split_commission(cost, 1_500)
    return [
        Entry(tenant_reserved(tenant), -reserved),
        Entry(provider_pending(provider), earned),
        Entry(COMMISSION, commission),
        Entry(tenant_balance(tenant), reserved - cost),
    ]


async def setup(db: Database) -> None:
    async with db.write() as session:
        for tenant in TENANTS:
            await ledger.post(
                session,
                cause=f"topup:{tenant}",
                kind=TransactionKind.TOP_UP,
                entries=transfer(WORLD, tenant_balance(tenant), 10**13),
                now=NOW,
            )
        await session.execute(
            text("CREATE TABLE bare_a (id bigserial PRIMARY KEY, cause text, amount bigint)")
        )
        await session.execute(
            text("CREATE TABLE bare_b (id bigserial PRIMARY KEY, cause text, amount bigint)")
        )


async def ours(db: Database, n: int, round_no: int) -> float:
    tenant, provider = TENANTS[round_no % len(TENANTS)], PROVIDERS[round_no % len(PROVIDERS)]
    async with db.write() as session:  # the reserve the charge settles, not timed
        await ledger.post(
            session,
            cause=f"r{round_no}:reserve",
            kind=TransactionKind.RESERVE,
            entries=transfer(tenant_balance(tenant), tenant_reserved(tenant), n * 1_000),
            now=NOW,
        )
    started = time.perf_counter()
    for i in range(n):
        async with db.write() as session:
            await ledger.post(
                session,
                cause=f"r{round_no}:inv{i}:settle",
                kind=TransactionKind.CHARGE,
                entries=charge_entries(tenant, provider, 1_000, 777),
                now=NOW,
            )
    return n / (time.perf_counter() - started)


async def bare(db: Database, n: int, round_no: int) -> float:
    started = time.perf_counter()
    for i in range(n):
        async with db.write() as session:
            cause = f"r{round_no}:bare{i}"
            await session.execute(
                text("INSERT INTO bare_a (cause, amount) VALUES (:c, :a)"), {"c": cause, "a": 777}
            )
            await session.execute(
                text("INSERT INTO bare_b (cause, amount) VALUES (:c, :a)"), {"c": cause, "a": -777}
            )
    return n / (time.perf_counter() - started)


async def finished_invokes(db: Database, count: int) -> list[str]:
    """`count` invokes that ran 1–60 s on priced nodes, each with its reserve posted,
    written in bulk (the setup is not what is measured)."""
    now = NOW
    async with db.write() as session:
        await session.execute(
            insert(ProviderRow),
            [
                {"id": p, "name": p, "email": f"{p}@x", "tier": "community", "created_at": now}
                for p in PROVIDERS
            ],
        )
        await session.execute(
            insert(TenantRow),
            [{"id": t, "name": t, "email": f"{t}@x", "created_at": now} for t in TENANTS],
        )
        nodes = [(f"nod_bench{i:03d}", PROVIDERS[i % len(PROVIDERS)]) for i in range(40)]
        await session.execute(
            insert(NodeRow),
            [
                {
                    "id": node_id,
                    "provider_id": provider,
                    "hostname": node_id,
                    "agent_version": "bench",
                    "cpu_count": 8,
                    "ram_mb": 65536,
                    "gpus": [],
                    "runtimes": ["onnx_cpu"],
                    "sandbox": "bwrap",
                    "max_concurrent_jobs": 1,
                    "tier": "community",
                    "price_per_gpu_hour_micro": 1_800_000,
                    "delisted": False,
                    "registered_at": now,
                    "poll_free_slots": 0,
                    "poll_free_gpus": 0,
                }
                for node_id, provider in nodes
            ],
        )
    ids = [new_id("inv") for _ in range(count)]
    reserved = most_for(1_800_000, 60)
    for start in range(0, count, 5000):
        chunk = list(enumerate(ids[start : start + 5000], start))
        async with db.write() as session:
            await session.execute(
                insert(InvokeRow),
                [
                    {
                        "id": invoke_id,
                        "tenant_id": TENANTS[i % len(TENANTS)],
                        "node_id": nodes[i % len(nodes)][0],
                        "status": "done",
                        "runtime": "onnx_cpu",
                        "priority": "on_demand",
                        "model_url": "https://example.com/m.onnx",
                        "inputs_url": "",
                        "timeout_sec": 60,
                        "gpus": 0,
                        "constraints": {},
                        "warnings": [],
                        "attempts": 1,
                        "max_attempts": 3,
                        "created_at": now,
                        "started_at": now,
                        "finished_at": now + timedelta(milliseconds=1_000 + i % 59_000),
                        "log_bytes": 0,
                        "reserved_micro": reserved,
                        "rate_micro_per_hour": 1_800_000,
                    }
                    for i, invoke_id in chunk
                ],
            )
            await session.execute(
                insert(LedgerTransactionRow),
                [
                    {
                        "id": f"txn_r{i}",
                        "cause": reserve_cause(invoke_id),
                        "kind": TransactionKind.RESERVE.value,
                        "created_at": now,
                        "details": {"commission_bps": 1_500},
                    }
                    for i, invoke_id in chunk
                ],
            )
            await session.execute(
                insert(LedgerEntryRow),
                [
                    {
                        "transaction_id": f"txn_r{i}",
                        "account_id": account.id,
                        "amount_micro": amount,
                        "created_at": now,
                    }
                    for i, _ in chunk
                    for account, amount in (
                        (tenant_balance(TENANTS[i % len(TENANTS)]), -reserved),
                        (tenant_reserved(TENANTS[i % len(TENANTS)]), reserved),
                    )
                ],
            )
    async with db.write() as session:  # the kept balances those entries add up to
        await session.execute(
            text(
                "INSERT INTO ledger_accounts (id, kind, owner_id, balance_micro, created_at) "
                "SELECT account_id, split_part(account_id, ':', 1), split_part(account_id, ':', 2),"
                " sum(amount_micro), now() FROM ledger_entries"
                " WHERE account_id NOT IN ('world', 'platform_commission') GROUP BY account_id "
                "ON CONFLICT (id) DO UPDATE SET balance_micro = excluded.balance_micro"
            )
        )
    return ids


async def settle_many(db: Database, ids: list[str], writers: int) -> float:
    """Each invoke settled as its final status change settles it: `billing.settle` in
    its own write transaction, with the invoke as that change's UPDATE returns it."""
    queue = iter(ids)

    async def writer() -> None:
        for invoke_id in queue:
            async with db.write() as session:
                final = (
                    await session.execute(
                        select(*billing.SETTLED_COLUMNS).where(InvokeRow.id == invoke_id)
                    )
                ).one()
                await billing.settle(session, final, NOW)

    started = time.perf_counter()
    await asyncio.gather(*[writer() for _ in range(writers)])
    return time.perf_counter() - started


async def main(postings: int, invokes: int, writers: int) -> None:
    url = await create_scratch_postgres()
    try:
        await migrate.upgrade(url)
        db = Database(url)
        await setup(db)
        ours_rates, bare_rates = [], []
        for round_no in range(3):
            ours_rates.append(await ours(db, postings, round_no))
            bare_rates.append(await bare(db, postings, round_no))
        o, b = statistics.median(ours_rates), statistics.median(bare_rates)
        print(f"(a) one charge posting: ours {o:.0f}/s, two bare INSERTs {b:.0f}/s")
        print(f"    ratio ours/bare = {o / b:.2f} (target >= 0.5)")

        ids = await finished_invokes(db, invokes)
        seconds = await settle_many(db, ids, writers)
        async with db.read() as session:
            entries, balances = await ledger.books_total(session)
            charged = await session.scalar(
                select(func.count())
                .select_from(LedgerTransactionRow)
                .where(
                    LedgerTransactionRow.kind == TransactionKind.CHARGE.value,
                    LedgerTransactionRow.cause.like("invoke:%"),
                )
            )
        print(
            f"(b) {invokes} finished invokes settled by {writers} writers: {seconds:.1f} s "
            f"({invokes / seconds:.0f} invokes/s); {charged} charges; books: entries sum "
            f"{entries}, balances sum {balances}"
        )
        assert (entries, balances, charged) == (0, 0, invokes)
        await db.dispose()
    finally:
        await drop_scratch_postgres(url)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--postings", type=int, default=2000)
    parser.add_argument("--invokes", type=int, default=100_000)
    parser.add_argument("--writers", type=int, default=32)
    args = parser.parse_args()
    asyncio.run(main(args.postings, args.invokes, args.writers))
