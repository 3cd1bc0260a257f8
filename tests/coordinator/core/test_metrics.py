"""`core.metrics`: counts made at commit only, and several processes' counts added up in
one scrape (prometheus_client's multiprocess mode, as `--workers` would run)."""

import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from gpu_share.coordinator import migrate
from gpu_share.coordinator.core import metrics
from gpu_share.coordinator.core.db import Database


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[Database]:
    await migrate.upgrade(db_url)
    database = Database(db_url)
    yield database
    await database.dispose()


async def test_a_count_is_made_when_its_transaction_commits_and_never_if_it_rolls_back(
    db: Database,
) -> None:
    counted: list[str] = []
    async with db.write() as session:
        await session.execute(text("SELECT 1"))
        metrics.after_commit(session, lambda: counted.append("committed"))
        assert counted == []  # not before the commit
    assert counted == ["committed"]

    async def failing_change() -> None:
        async with db.write() as session:
            metrics.after_commit(session, lambda: counted.append("rolled back"))
            raise RuntimeError("the change fails")

    with pytest.raises(RuntimeError):
        await failing_change()
    async with db.write() as session:  # a later commit does not count the rolled back one
        await session.execute(text("SELECT 1"))
    assert counted == ["committed"]


def test_the_scrape_adds_up_every_process_counts_in_multiprocess_mode(tmp_path: Path) -> None:
    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    count = (
        "import sys; from gpu_share.coordinator.core import metrics; "
        "[metrics.INVOKES_ENDED.labels('done').inc() for _ in range(int(sys.argv[1]))]; "
        "metrics.CLAIM_SECONDS.observe(0.003)"
    )
    for times in (3, 4):  # two server processes, each counting its own
        subprocess.run([sys.executable, "-c", count, str(times)], env=env, check=True)
    scrape = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from gpu_share.coordinator.core import metrics; "
            "sys.stdout.write(metrics.exposition([metrics.Reading('gpushare_x', 'x', (), "
            "[((), 1.0)])]).decode())",
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(scrape)
        for s in family.samples
    }
    assert samples[("gpushare_invokes_ended_total", (("status", "done"),))] == 7
    assert samples[("gpushare_claim_seconds_count", ())] == 2
    assert samples[("gpushare_x", ())] == 1  # the readings come after
