"""What one statement costs the coordinator's CPU: through SQLAlchemy, as the hot paths
run them, against the same query on the raw driver (issue 23).

PostgreSQL, one pooled session, the same primary-key read each way, N runs after a
warm-up; client CPU time per statement (`time.process_time`, which includes asyncpg's
own work and the event loop, not the server's). Baseline: asyncpg `fetch` with `$1`.

Run: .venv/bin/python bench/statement_cost.py [--runs 2000]
"""

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import bindparam, select, text

from gpu_share.coordinator import migrate
from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.orm import InvokeRow
from gpu_share.testing.databases import create_scratch_postgres, drop_scratch_postgres

RAW_SQL = "SELECT id, status, node_id FROM invokes WHERE id = $1"


async def cost_us(call: Callable[[int], Awaitable[Any]], runs: int) -> float:
    for i in range(50):
        await call(i)
    started = time.process_time()
    for i in range(runs):
        await call(i)
    return (time.process_time() - started) * 1e6 / runs


async def main(runs: int) -> None:
    url = await create_scratch_postgres("gpushare_stmt")
    await migrate.upgrade(url)
    db = Database(url)
    core = select(InvokeRow.id, InvokeRow.status, InvokeRow.node_id)
    prebuilt_core = core.where(InvokeRow.id == bindparam("id"))
    prebuilt_orm = select(InvokeRow).where(InvokeRow.id == bindparam("id"))
    try:
        async with db.read() as s:
            raw = (await (await s.connection()).get_raw_connection()).driver_connection
            assert raw is not None

            async def fresh_core(i: int) -> Any:
                return (await s.execute(core.where(InvokeRow.id == f"x{i}"))).all()

            async def fresh_orm(i: int) -> Any:
                return (await s.execute(select(InvokeRow).where(InvokeRow.id == f"x{i}"))).all()

            ways: list[tuple[str, Callable[[int], Awaitable[Any]]]] = [
                ("raw asyncpg (baseline)", lambda i: raw.fetch(RAW_SQL, f"x{i}")),
                (
                    "text(), driver SQL",
                    lambda i: s.execute(text(RAW_SQL.replace("$1", ":id")), {"id": f"x{i}"}),
                ),
                ("Core select, prebuilt", lambda i: s.execute(prebuilt_core, {"id": f"x{i}"})),
                ("Core select, built each time", fresh_core),
                ("ORM select, prebuilt", lambda i: s.execute(prebuilt_orm, {"id": f"x{i}"})),
                ("ORM select, built each time", fresh_orm),
                ("session.get", lambda i: s.get(InvokeRow, f"x{i}")),
            ]
            # Two rounds, the second in the reverse order, so no way always runs first.
            results: dict[str, list[float]] = {name: [] for name, _ in ways}
            for order in (ways, ways[::-1]):
                for name, call in order:
                    results[name].append(await cost_us(call, runs))
    finally:
        await db.dispose()
        await drop_scratch_postgres(url)
    floor = min(results["raw asyncpg (baseline)"])
    print(f"client CPU per statement, {runs} runs each, best of 2 rounds:")
    for name, values in results.items():
        best = min(values)
        print(f"  {name:30s} {best:6.0f} µs   {best / floor:5.1f}× raw asyncpg")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2000)
    asyncio.run(main(parser.parse_args().runs))
