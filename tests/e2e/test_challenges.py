"""A hardware challenge end to end (docs/trust.md): a real agent process on this CPU
machine hears it in a heartbeat answer, runs the chain in a child process on
onnxruntime's CPU provider, commits, reveals, and its cores become verified."""

import asyncio
from typing import Any

import pytest

from gpu_share.coordinator.core.db import Database
from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.coordinator.core.settings import Settings
from gpu_share.testing.factories import ADMIN
from gpu_share.testing.live import AGENT_START_TIMEOUT_SEC, Live
from gpu_share.testing.waiting import eventually

pytestmark = pytest.mark.slow

pytest.importorskip("onnxruntime")


@pytest.fixture
def settings(settings: Settings) -> Settings:
    settings.challenge_scale = 1e-3  # a chain of milliseconds, the whole protocol
    settings.challenge_interval_sec = 0.5
    return settings


async def passed_challenge(live: Live, timeout: float) -> tuple[str, dict[str, Any]]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        nodes = (await live.http.get("/v1/nodes", headers=live.tenant_headers)).json()
        if nodes:
            node_id = nodes[0]["id"]
            listed = await live.http.get(f"/v1/admin/nodes/{node_id}/challenges", headers=ADMIN)
            assert listed.status_code == 200, listed.text
            decided = [c for c in listed.json() if c["status"] not in ("issued", "started")]
            if decided and decided[0]["status"] != "committed":
                return node_id, decided[0]
        if loop.time() > deadline:
            raise AssertionError("no challenge decided:\n" + live.agents[0].log[-4000:])
        await asyncio.sleep(0.25)


async def test_a_real_agent_passes_a_cpu_challenge_on_onnxruntime(
    live: Live, settings: Settings
) -> None:
    agent = live.agent(
        "challenged",
        env={"GPUSHARE_AGENT_CHALLENGES": "1", "GPUSHARE_AGENT_CHALLENGE_QUIET_SEC": "0"},
    )
    node_id, challenge = await passed_challenge(live, AGENT_START_TIMEOUT_SEC + 60)
    assert challenge["status"] == "passed", (challenge, agent.log[-3000:])
    assert challenge["kind"] == "cpu" and challenge["target"] == "cpu"
    assert challenge["verdict"]["rate_unit"] == "GFLOP/s" and challenge["verdict"]["rate"] > 0
    # The coordinator decided at the reveal; the agent logs the verdict once its answer
    # arrives, which may be a moment after the test sees the decision.
    passed_line = f"challenge {challenge['id']} passed"

    async def agent_log() -> str:
        return agent.log

    log = await eventually(agent_log, lambda text: passed_line in text, what="the agent logs it")
    assert f"challenge {challenge['id']} on onnxruntime CPU FP32" in log

    db = Database(settings.database_url)
    try:
        async with db.read() as session:
            node = await session.get(NodeRow, node_id)
            assert node is not None and node.verification is not None
            proof = node.verification["cpu"]
    finally:
        await db.dispose()
    assert proof["cores"] == node.cpu_count and proof["challenge_id"] == challenge["id"]
    assert proof["rate_gflops"] == challenge["verdict"]["rate"]
