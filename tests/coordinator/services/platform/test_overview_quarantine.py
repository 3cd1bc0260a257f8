"""Quarantined nodes are counted apart, never as online capacity (docs/trust.md), on
SQLite and PostgreSQL: the admin overview's counts, the GPUs it says are offered, the
public health check and each provider's nodes online leave a quarantined node out while
it still heartbeats, as the offers tenants search do, and count it as quarantined."""

from datetime import datetime

import httpx
from fastapi import FastAPI

from gpu_share.coordinator.core.orm import NodeRow
from gpu_share.coordinator.services.platform import overview
from gpu_share.testing.factories import ProviderHandle, TenantHandle
from gpu_share.testing.simulated_agent import H100, AgentFactory, SimulatedAgent, inventory


async def quarantine(app: FastAPI, agent: SimulatedAgent) -> None:
    """As the trust rules quarantine a node caught returning wrong results."""
    replica = app.state.replica
    async with replica.db.write() as session:
        node = await session.get(NodeRow, agent.node_id)
        assert node is not None
        node.quarantined_at = replica.clock.now()
        node.quarantine_reason = "caught returning wrong results"


async def read_counts(app: FastAPI, now: datetime) -> overview.Counts:
    replica = app.state.replica
    async with replica.db.read() as session:
        return await overview.counts(session, now, replica.settings)


async def test_a_quarantined_node_is_counted_apart_and_never_as_online_capacity(
    app: FastAPI,
    client: httpx.AsyncClient,
    sim_agent: AgentFactory,
    provider: ProviderHandle,
    tenant: TenantHandle,
) -> None:
    honest = await sim_agent(inventory(gpus=[H100] * 2, hostname="honest"), verified=True)
    caught = await sim_agent(inventory(gpus=[H100] * 4, hostname="caught"), verified=True)
    await sim_agent(inventory(hostname="cpu-only"))  # a CPU node offers no GPU
    now = app.state.replica.clock.now()
    assert (await read_counts(app, now)).nodes_online == 3

    await quarantine(app, caught)
    await caught.heartbeat()  # still heard from: quarantine, not silence, keeps it out
    counts = await read_counts(app, now)
    assert (counts.nodes_online, counts.nodes_total) == (2, 3)
    assert (await client.get("/health")).json()["nodes_online"] == 2
    assert (counts.nodes_quarantined, counts.gpus_online) == (1, 2)
    async with app.state.replica.db.read() as session:
        (summary,) = await overview.provider_summaries(session, now, app.state.replica.settings)
    assert (summary.id, summary.nodes, summary.nodes_online) == (provider.id, 3, 2)

    # The offers tenants search agree: the quarantined node's GPUs are not offered.
    offers = (await client.get("/v1/offers", headers=tenant.headers)).json()
    offered = {offer["node_id"] for offer in offers}
    assert honest.node_id in offered and caught.node_id not in offered
