"""The agent's start (`Agent.connect`): a machine the coordinator refuses stops with the
coordinator's reason, in words, rather than a traceback or a retry loop; and its stop
(`Agent.run`'s drain)."""

import asyncio
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from gpu_share.agent.worker import AgentStartError
from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.testing.factories import ProviderHandle, create_provider
from tests.agent.test_gpu_leases import make_agent


async def quarantine(app: FastAPI, node_id: str | None) -> None:
    replica = app.state.replica
    async with replica.db.write() as session:
        row = await session.get(NodeRow, node_id)
        assert row is not None
        row.quarantined_at = replica.clock.now()
        row.quarantine_reason = "mismatch"


async def test_a_quarantined_machine_is_refused_at_start_with_the_reason(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, tmp_path: Path
) -> None:
    first = make_agent(tmp_path / "first", app, provider.enrollment_token)
    await first.connect()
    await quarantine(app, first.node_id)

    # The same GPUs under a new account and a fresh data directory: refused by the GPUs.
    other = await create_provider(client, "Fresh Start Ltd")
    again = make_agent(tmp_path / "again", app, other.enrollment_token)
    with pytest.raises(AgentStartError, match="quarantined"):
        await again.connect()
    await first.client.aclose()
    await again.client.aclose()


async def test_a_saved_node_taking_in_quarantined_gpus_is_refused_at_start(
    app: FastAPI, client: httpx.AsyncClient, provider: ProviderHandle, tmp_path: Path
) -> None:
    first = make_agent(tmp_path / "first", app, provider.enrollment_token)
    await first.connect()
    await quarantine(app, first.node_id)
    await first.client.aclose()

    # A node registered without those GPUs (its inventory made empty), restarted with them.
    other = await create_provider(client, "Fresh Start Ltd")
    bare = make_agent(tmp_path / "bare", app, other.enrollment_token)
    bare.gpus, bare.fingerprint = [], "0" * 64
    await bare.connect()
    await bare.client.aclose()
    restarted = make_agent(tmp_path / "bare", app)  # the saved identity, the GPUs back
    with pytest.raises(AgentStartError, match=r"refused this machine.*quarantined"):
        await restarted.connect()
    await restarted.client.aclose()


class Reporting:
    """A job as the drain sees it: its result on its way, or still running."""

    def __init__(self, reporting: bool) -> None:
        self.reporting = reporting


async def test_at_stop_a_result_on_its_way_arrives_and_a_running_job_is_left(
    tmp_path: Path,
) -> None:
    """`gpu-share up` stops its agent with no drain: a job whose result is being reported
    is over, and cutting the report off would leave a finished job to be run again (and
    the stop would say one job is left running); a job still running is left at once."""
    agent = make_agent(tmp_path)
    arrived = asyncio.Event()

    async def report_on_its_way() -> None:
        await asyncio.sleep(0.5)  # a slow network, or a busy coordinator
        arrived.set()
        agent.jobs.pop("inv_reporting")

    async def still_running() -> None:
        await asyncio.sleep(60)

    agent.jobs = {"inv_reporting": Reporting(True), "inv_running": Reporting(False)}  # type: ignore[dict-item]
    agent._tasks = {
        asyncio.create_task(report_on_its_way()),
        running := asyncio.create_task(still_running()),
    }
    for task in agent._tasks:
        task.add_done_callback(agent._tasks.discard)
    await asyncio.wait_for(agent._drain(0), 10)
    assert arrived.is_set()  # let arrive, not cut off
    assert running.cancelled()
    assert agent.left_running == 1  # the running one only
    await agent.client.aclose()
