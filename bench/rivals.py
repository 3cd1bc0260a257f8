"""The rivals a claim reads: every other node waiting in a long-poll, ranked.

A claim of a job younger than `rivals.RANKING_GRACE_SEC` reads every node waiting in a
long-poll with room, to leave the job to a better ranked one (`rivals.better_pollers`).
On PostgreSQL with `--nodes` waiting nodes (`placement.fill`'s, each carrying what a
working node carries: heartbeat telemetry for four GPUs, a GPU topology, a spot-check
record), the read as it is (the columns ranking and `placement.serves` need) against the
baseline it replaced, side by side in one process, alternating: the whole rows read and
ranked the same way. Prints the CPU per read (p50) of each and the ratio.

Run: .venv/bin/python bench/rivals.py [--nodes 1000] [--reads 30]
"""

import argparse
import asyncio
import json
import random
import statistics
import time
from datetime import UTC, datetime, timedelta

from placement import fill
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from gpu_share.coordinator import migrate
from gpu_share.coordinator.core import driver_models
from gpu_share.coordinator.core.db import Database, driver_of
from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.coordinator.services.nodes import ranking
from gpu_share.coordinator.services.work import rivals
from gpu_share.testing.databases import create_scratch_postgres, drop_scratch_postgres

_WHOLE = driver_models.whole_row(
    NodeRow,
    "WHERE nodes.polling_until > :poll_now AND nodes.id != :poll_node"
    " AND nodes.poll_free_slots > 0",
)

TELEMETRY = {
    "cpu_pct": 12.5,
    "ram_used_mb": 20480,
    "gpus": [
        {"index": i, "util_pct": 35.0, "mem_used_mb": 12000, "temp_c": 61, "power_w": 250.5}
        for i in range(4)
    ],
}
TOPOLOGY = {"links": [["X" if i == j else "NV12" for j in range(4)] for i in range(4)]}
SPOT_CHECKS = {
    "runtimes": {
        "onnx_cpu": {"matched": 41, "mismatched": 0, "rate": 0.05},
        "onnx_cuda": {"matched": 12, "mismatched": 1, "rate": 0.1},
    }
}


async def whole_rows(session: AsyncSession, node: NodeRow, now: datetime) -> list[NodeRow]:
    """The baseline: every waiting node's whole row, ranked as `better_pollers` ranks."""
    tx = await driver_of(session)
    rows = await tx.fetch(_WHOLE, poll_now=now, poll_node=node.id)
    mine = ranking.rank(node)
    waiting = (driver_models.transient(NodeRow, row) for row in rows)
    return [other for other in waiting if ranking.rank(other) > mine]


async def main(args: argparse.Namespace) -> None:
    random.seed(7)
    url = await create_scratch_postgres("gpushare_rivals")
    try:
        await migrate.upgrade(url)
        db = Database(url)
        now = datetime.now(UTC)
        node_ids = await fill(db, args.nodes, 0, 1, now)
        async with db.write() as session:
            await session.execute(
                text(
                    "UPDATE nodes SET polling_until = :until, poll_free_slots = 1,"
                    " telemetry = CAST(:telemetry AS JSON), gpu_topology = CAST(:topology AS"
                    " JSON), spot_checks = CAST(:spot_checks AS JSON)"
                ),
                {
                    "until": now + timedelta(hours=1),
                    "telemetry": json.dumps(TELEMETRY),
                    "topology": json.dumps(TOPOLOGY),
                    "spot_checks": json.dumps(SPOT_CHECKS),
                },
            )
        async with db.read() as session:
            asking = await session.get(NodeRow, node_ids[0])
        assert asking is not None
        ways = {"ours": rivals.better_pollers, "whole rows": whole_rows}
        cpu: dict[str, list[float]] = {name: [] for name in ways}
        found: dict[str, int] = {}
        for n in range(args.reads * len(ways)):
            name = list(ways)[n % len(ways)]
            started = time.process_time()
            async with db.write() as session:
                found[name] = len(await ways[name](session, asking, now))
            cpu[name].append((time.process_time() - started) * 1000)
        await db.dispose()
    finally:
        await drop_scratch_postgres(url)
    assert found["ours"] == found["whole rows"], found
    p50 = {name: statistics.median(times) for name, times in cpu.items()}
    print(f"{args.nodes} nodes waiting, {found['ours']} ranked above the asking one:")
    for name in ways:
        print(f"    {name:>10}: CPU per read p50 {p50[name]:6.1f} ms")
    print(f"    ours ÷ whole rows: {p50['ours'] / p50['whole rows']:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--reads", type=int, default=30)
    asyncio.run(main(parser.parse_args()))
