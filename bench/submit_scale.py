"""A submit's cost as the fleet grows (issue 23; bench/README.md, "Submit at scale").

A submit weighs every online node that could take the job: its rate sets the most the
invoke may cost, and with a cap, which nodes stay eligible. Each node's on-demand rate
was once read with its own statement (twice for a capped submit), then all in one;
now `prices.on_demand_rates` takes the nodes' denormalised rates, with no read. For 10,
100 and 1,000 online priced CPU nodes, in-process (the coordinator app over ASGI, no
sockets):

- the rate lookup over the serving nodes: read from the prices per node (the first
  code, kept here as the baseline) against the denormalised rates, interleaved in
  rounds on the same rows, which must agree;
- `POST /v1/gpu/invoke` end to end (auth, validation, placement check, reserve, insert),
  p50 and p99, and its ratio to the 10-node figure.

Run: .venv/bin/python bench/submit_scale.py [--postgres] [--submits 200] [--sizes 10,100,1000]
     [--working]
"""

import argparse
import asyncio
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
from pydantic import SecretStr
from rivals import SPOT_CHECKS, TELEMETRY, TOPOLOGY
from sqlalchemy import insert, select

from gpu_share.coordinator import migrate
from gpu_share.coordinator.app import create_app
from gpu_share.coordinator.core.ids import new_id
from gpu_share.coordinator.core.orm import NodeRow, ProviderPriceRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.coordinator.services.nodes import prices
from gpu_share.testing.clock import SystemClock
from gpu_share.testing.databases import create_scratch_postgres, drop_scratch_postgres
from gpu_share.testing.factories import ADMIN, TEST_ADMIN_KEY, create_provider, create_tenant

BODY = {"runtime": "onnx_cpu", "model_url": "https://example.com/m.onnx", "inputs_url": ""}
ROUNDS = 5


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def add_nodes(app: object, provider_id: str, count: int, *, working: bool) -> None:
    """`count` online priced CPU nodes; `working`: each carries what a working node's row
    carries (its heartbeats' telemetry, a GPU topology, a spot-check record)."""
    carried = (
        {"telemetry": TELEMETRY, "gpu_topology": TOPOLOGY, "spot_checks": SPOT_CHECKS}
        if working
        else {}
    )
    db = app.state.replica.db  # type: ignore[attr-defined]
    now = datetime.now(UTC)
    async with db.write() as session:
        await session.execute(
            insert(ProviderPriceRow),
            [
                {
                    "provider_id": provider_id,
                    "gpu_model": "cpu",
                    "price_micro_per_hour": 100_000,
                    "spot_discount_bps": 4_000,
                    "updated_at": now,
                }
            ],
        )
        await session.execute(
            insert(NodeRow),
            [
                {
                    "id": new_id("nod"),
                    "provider_id": provider_id,
                    "hostname": f"bench-{n}",
                    "agent_version": "bench",
                    "cpu_count": 8,
                    "ram_mb": 65536,
                    "gpus": [],
                    "runtimes": ["onnx_cpu"],
                    "sandbox": "bwrap",
                    "max_concurrent_jobs": 4,
                    "tier": "community",
                    "price_per_gpu_hour_micro": 100_000,
                    "reliability": {"score": 0.9},
                    "delisted": False,
                    "registered_at": now,
                    "last_seen_at": now,
                    "poll_free_slots": 0,
                    "poll_free_gpus": 0,
                    **carried,
                }
                for n in range(count)
            ],
        )


async def rate_lookups(app: object) -> tuple[list[float], list[float]]:
    """Per-node reads (the baseline) and the denormalised rates, interleaved, in ms."""
    db = app.state.replica.db  # type: ignore[attr-defined]
    per_node: list[float] = []
    batched: list[float] = []
    async with db.read() as session:
        nodes = list((await session.scalars(select(NodeRow))).all())
        for _ in range(ROUNDS):
            started = time.perf_counter()
            one_by_one = [await prices.read_rate(session, n, spot=False) for n in nodes]
            per_node.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            together = prices.on_demand_rates(nodes)
            batched.append((time.perf_counter() - started) * 1000)
            assert sorted(together.values()) == sorted(one_by_one)
    return per_node, batched


async def one_size(
    database_url: str, data_dir: Path, nodes: int, submits: int, *, working: bool
) -> dict[str, float]:
    settings = Settings(
        data_dir=data_dir,
        database_url=database_url,
        admin_key=SecretStr(TEST_ADMIN_KEY),
        run_background_loops=False,
    )
    app = create_app(settings, clock=SystemClock())
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            provider = await create_provider(client)
            tenant = await create_tenant(client)
            top_up = await client.post(
                f"/v1/admin/tenants/{tenant.id}/top-ups",
                json={"amount": "100000", "reference": "bench"},
                headers=ADMIN,
            )
            assert top_up.status_code in (200, 201), top_up.text
            await add_nodes(app, provider.id, nodes, working=working)
            per_node, batched = await rate_lookups(app)
            timings = []
            for _ in range(submits):
                started = time.perf_counter()
                answer = await client.post("/v1/gpu/invoke", json=BODY, headers=tenant.headers)
                timings.append((time.perf_counter() - started) * 1000)
                assert answer.status_code == 202, answer.text
    return {
        "per_node": statistics.median(per_node),
        "batched": statistics.median(batched),
        "p50": statistics.median(timings),
        "p99": percentile(timings, 0.99),
    }


async def main(args: argparse.Namespace) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    results: dict[int, dict[str, float]] = {}
    for nodes in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            if args.postgres:
                url = await create_scratch_postgres("gpushare_bench_submit")
            else:
                url = f"sqlite+aiosqlite:///{tmp}/bench.db"
            try:
                await migrate.upgrade(url)
                results[nodes] = await one_size(
                    url, Path(tmp) / "data", nodes, args.submits, working=args.working
                )
            finally:
                if args.postgres:
                    await drop_scratch_postgres(url)
    base = results[sizes[0]]["p50"]
    print(
        f"database: {'PostgreSQL' if args.postgres else 'SQLite'}; {args.submits} submits each;"
        f" nodes {'carrying telemetry, topology, spot checks' if args.working else 'bare'}"
    )
    print(
        "nodes | rates read per node (baseline) | denormalised | ratio"
        " | submit p50 | p99 | p50 / first"
    )
    for nodes, r in results.items():
        print(
            f"{nodes:>5} | {r['per_node']:8.2f} ms | {r['batched']:6.2f} ms | "
            f"{r['per_node'] / r['batched']:5.1f}× | {r['p50']:6.2f} ms | {r['p99']:6.2f} ms | "
            f"{r['p50'] / base:4.2f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--postgres", action="store_true")
    parser.add_argument("--submits", type=int, default=200)
    parser.add_argument("--sizes", default="10,100,1000")
    parser.add_argument(
        "--working",
        action="store_true",
        help="each node's row carries what a working node's does: telemetry, a GPU topology,"
        " a spot-check record (else those are empty)",
    )
    asyncio.run(main(parser.parse_args()))
