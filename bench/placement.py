"""Placement at scale (issue: benchmarks, schedules, reliability, ranked placement).

On PostgreSQL with 10,000 online nodes and 100,000 queued invokes of 50 tenants, the
latency of one claim (`claims.claim`: eligibility, ranking, fair share, the guarded
lease) against a bare `FOR UPDATE SKIP LOCKED` claim on the same rows, side by side in
one run. Target: p99 of ours ≤ 20 ms (issue 23; it was 50). Prints both and the ratio.

Run: .venv/bin/python bench/placement.py [--nodes 10000] [--invokes 100000] [--claims 300]
"""

import argparse
import asyncio
import random
import secrets
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy import insert

from gpu_share.coordinator import migrate
from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.ids import new_id
from gpu_share.coordinator.core.orm import InvokeRow, NodeRow, ProviderRow, TenantRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.core.signing import UrlSigner
from gpu_share.coordinator.services.work import artifact_refs, claims
from gpu_share.coordinator.storage import LocalArtifactStore
from gpu_share.protocol import agent as wire
from gpu_share.testing.databases import create_scratch_postgres, drop_scratch_postgres

MODEL_URL = "https://example.com/model.onnx"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def fill(db: Database, nodes: int, invokes: int, tenants: int, now: datetime) -> list[str]:
    async with db.write() as session:
        await session.execute(
            insert(ProviderRow),
            [
                {
                    "id": "prv_bench",
                    "name": "Bench",
                    "email": "b@x",
                    "tier": "community",
                    "created_at": now,
                }
            ],
        )
        tenant_ids = [new_id("ten") for _ in range(tenants)]
        await session.execute(
            insert(TenantRow),
            [{"id": t, "name": t, "email": f"{t}@x", "created_at": now} for t in tenant_ids],
        )
    node_ids = [new_id("nod") for _ in range(nodes)]
    for start in range(0, nodes, 2000):
        async with db.write() as session:
            await session.execute(
                insert(NodeRow),
                [
                    {
                        "id": node_id,
                        "provider_id": "prv_bench",
                        "hostname": node_id,
                        "agent_version": "bench",
                        "cpu_count": 8,
                        "ram_mb": 65536,
                        "gpus": [],
                        "runtimes": ["onnx_cpu"],
                        "sandbox": "bwrap",
                        "max_concurrent_jobs": 1,
                        "tier": random.choice(["community", "enterprise"]),
                        "price_per_gpu_hour_micro": random.randrange(0, 3_000_000),
                        "reliability": {"score": random.random()},
                        "delisted": False,
                        "registered_at": now,
                        "last_seen_at": now,
                        "poll_free_slots": 0,
                        "poll_free_gpus": 0,
                    }
                    for node_id in node_ids[start : start + 2000]
                ],
            )
    for start in range(0, invokes, 5000):
        async with db.write() as session:
            await session.execute(
                insert(InvokeRow),
                [
                    {
                        "id": new_id("inv"),
                        "tenant_id": random.choice(tenant_ids),
                        "status": "queued",
                        "runtime": "onnx_cpu",
                        "priority": "on_demand",
                        "model_url": MODEL_URL,
                        "inputs_url": "",
                        "timeout_sec": 600,
                        "gpus": 0,
                        "constraints": {},
                        "warnings": [],
                        "attempts": 0,
                        "max_attempts": 3,
                        "created_at": now - timedelta(seconds=invokes - start - n),
                        "log_bytes": 0,
                    }
                    for n in range(min(5000, invokes - start))
                ],
            )
    return node_ids


async def ours(db: Database, node_ids: list[str], now: datetime) -> list[float]:
    settings = Settings(database_url=db.url, data_dir=Path(tempfile.mkdtemp()))
    ctx = artifact_refs.LeaseContext(
        settings=settings,
        store=LocalArtifactStore(settings.artifacts_path),
        signer=UrlSigner(b"k" * 32),
        base_url="http://x",
    )
    request = wire.LeaseRequest(slots=1, free_gpus=0, wait_sec=0)
    timings = []
    for node_id in node_ids:  # each a node with its one slot free
        started = time.perf_counter()
        async with db.write() as session:
            jobs = await claims.claim(session, node_id, request, now, ctx)
        timings.append((time.perf_counter() - started) * 1000)
        assert len(jobs) == 1
    return timings


async def bare(dsn: str, node_ids: list[str]) -> list[float]:
    conn = await asyncpg.connect(dsn)
    timings = []
    try:
        for node_id in node_ids:
            started = time.perf_counter()
            async with conn.transaction():
                row = await conn.fetchrow(
                    "UPDATE invokes SET status = 'assigned', node_id = $1, lease_token = $2"
                    " WHERE id = (SELECT id FROM invokes WHERE status = 'queued'"
                    " ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id",
                    node_id,
                    secrets.token_hex(16),
                )
            timings.append((time.perf_counter() - started) * 1000)
            assert row is not None
    finally:
        await conn.close()
    return timings


def summary(name: str, timings: list[float]) -> dict[str, Any]:
    result = {
        "p50": statistics.median(timings),
        "p99": percentile(timings, 0.99),
        "mean": statistics.fmean(timings),
    }
    print(f"{name:>34}: p50 {result['p50']:.2f} ms  p99 {result['p99']:.2f} ms")
    return result


async def main(args: argparse.Namespace) -> None:
    url = await create_scratch_postgres("gpushare_bench")
    try:
        await migrate.upgrade(url)
        db = Database(url)
        now = datetime.now(UTC)
        started = time.perf_counter()
        node_ids = await fill(db, args.nodes, args.invokes, 50, now)
        print(
            f"filled {args.nodes} nodes and {args.invokes} queued invokes in "
            f"{time.perf_counter() - started:.0f} s"
        )
        dsn = url.replace("postgresql+asyncpg", "postgresql")
        conn = await asyncpg.connect(dsn)
        await conn.execute("ANALYZE")
        await conn.close()
        # Interleaved rounds, so both see the same data and the same machine.
        mine: list[float] = []
        theirs: list[float] = []
        picked = random.sample(node_ids, 2 * args.claims)
        per_round = args.claims // 3
        for n in range(3):
            chunk = picked[2 * n * per_round : 2 * (n + 1) * per_round]
            mine += await ours(db, chunk[:per_round], now)
            theirs += await bare(dsn, chunk[per_round:])
        a = summary("ours (claims.claim)", mine)
        b = summary("bare SKIP LOCKED claim", theirs)
        print(f"p99 ratio ours / bare: {a['p99'] / b['p99']:.1f}; target: ours p99 ≤ 20 ms")
        await db.dispose()
    finally:
        await drop_scratch_postgres(url)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--invokes", type=int, default=100_000)
    parser.add_argument("--claims", type=int, default=300)
    asyncio.run(main(parser.parse_args()))
