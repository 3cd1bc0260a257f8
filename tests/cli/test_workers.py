"""`gpu-share server --workers N` refuses what it cannot run, saying why (the workers
themselves are exercised end to end in tests/e2e/test_workers.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
