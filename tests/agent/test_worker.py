"""The agent's start (`Agent.connect`): a machine the coordinator refuses stops with the
coordinator's reason, in words, rather than a traceback or a retry loop."""

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
