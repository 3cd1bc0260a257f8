"""`gpu-share server --workers N` refuses what it cannot run, saying why (the workers
themselves are exercised end to end in tests/e2e/test_workers.py)."""

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import Select, func, select

from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.orm import ApiKeyRow, ReplicaRow
from gpu_share.testing.databases import empty_tables
from gpu_share.testing.servers import free_port


def server(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpu_share.cli.main", "server", "--port", str(free_port()), *args],
        env={**os.environ, "GPUSHARE_DATA_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_several_workers_on_sqlite_are_refused(tmp_path: Path) -> None:
    done = server(tmp_path, "--workers", "2")
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "gpu-share server: several workers need PostgreSQL "
        "(GPUSHARE_DATABASE_URL=postgresql+asyncpg://…); a SQLite file serves one process"
    )


@pytest.mark.parametrize("count", ["0", "-1"])
def test_fewer_than_one_worker_is_refused(tmp_path: Path, count: str) -> None:
    done = server(tmp_path, "--workers", count)
    assert done.returncode == 2
    assert "--workers must be at least 1" in done.stderr


def test_workers_starting_together_make_one_admin_key(
    postgres_database: str, tmp_path: Path
) -> None:
    """No GPUSHARE_ADMIN_KEY: the first start makes one, whichever worker gets there."""
    asyncio.run(empty_tables(postgres_database))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "GPUSHARE_ADMIN_KEY"}
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "gpu_share.cli.main", "server", "--port", str(port)),
            *("--workers", "3", "--log-level", "warning"),
        ],
        env={
            **env,
            "GPUSHARE_DATA_DIR": str(tmp_path),
            "GPUSHARE_DATABASE_URL": postgres_database,
            "PYTHONUNBUFFERED": "1",
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while asyncio.run(_replicas(postgres_database)) < 3:
            assert server.poll() is None and time.monotonic() < deadline, "no start"
            time.sleep(0.1)
    finally:
        server.terminate()
        out, _ = server.communicate(timeout=60)
    assert out.count("Admin key (shown once, store it now)") == 1, out
    assert asyncio.run(_admin_keys(postgres_database)) == 1


async def _replicas(url: str) -> int:
    return await _count(url, select(func.count()).select_from(ReplicaRow))


async def _admin_keys(url: str) -> int:
    return await _count(
        url, select(func.count()).select_from(ApiKeyRow).where(ApiKeyRow.role == "admin")
    )


async def _count(url: str, query: Select[int]) -> int:
    db = Database(url)
    try:
        async with db.read() as session:
            return int(await session.scalar(query) or 0)
    finally:
        await db.dispose()
