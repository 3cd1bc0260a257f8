"""The ledger's cost (issue: money), on PostgreSQL.

(a) Posting one charge (`ledger.post`: four entries, the once-per-cause insert, guarded
    balance updates, all in a savepoint) in its own write transaction, against two bare
    INSERTs in one transaction through the same engine, interleaved in rounds. Target:
    ours / bare throughput ≥ 0.5.
(b) Settling 100,000 invokes: each one reserved at submit and then charged, as billing
    does, one transaction each, with 32 concurrent writers; the time, and that the books
    still sum to zero afterwards.

Run: .venv/bin/python bench/ledger.py [--postings 2000] [--invokes 100000] [--writers 32]
"""

import argparse
import asyncio
import statistics
import time
from datetime import UTC, datetime

from sqlalchemy import text

from gpu_share.coordinator import migrate
from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.services import ledger
from gpu_share.coordinator.services.ledger import (
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


async def settle_many(db: Database, invokes: int, writers: int) -> float:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(invokes):
        queue.put_nowait(i)

    async def writer() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            tenant, provider = TENANTS[i % len(TENANTS)], PROVIDERS[i % len(PROVIDERS)]
            async with db.write() as session:
                await ledger.post(
                    session,
                    cause=f"settle100k:{i}:reserve",
                    kind=TransactionKind.RESERVE,
                    entries=transfer(tenant_balance(tenant), tenant_reserved(tenant), 5_000),
                    now=NOW,
                )
            async with db.write() as session:
                await ledger.post(
                    session,
                    cause=f"settle100k:{i}:settle",
                    kind=TransactionKind.CHARGE,
                    entries=charge_entries(tenant, provider, 5_000, 1_000 + i % 3_000),
                    now=NOW,
                )

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

        seconds = await settle_many(db, invokes, writers)
        async with db.read() as session:
            entries, balances = await ledger.books_total(session)
        print(
            f"(b) {invokes} invokes reserved and settled by {writers} writers: {seconds:.1f} s "
            f"({invokes / seconds:.0f} invokes/s); books: entries sum {entries}, "
            f"balances sum {balances}"
        )
        assert (entries, balances) == (0, 0)
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
