"""Spot checks for tests (docs/trust.md): a priced GPU node of the provider under test, a
trusted node of the platform's own (another provider, marked trusted by the admin),
tenants' jobs run by a `Behaviour` (`rogue_agents`) with the clock moving while they
run (so they cost something), and the spot-check loop's passes."""

import hashlib
import itertools
from dataclasses import dataclass, field
from typing import Any

import httpx
from fastapi import FastAPI

from gpu_share.coordinator.core.orm import NodeRow, ProviderPriceRow
from gpu_share.coordinator.loops import spot_checks as spot_check_loop
from gpu_share.coordinator.loops.spot_checks import SpotCheckPass
from gpu_share.coordinator.replica.state import Replica
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import ADMIN, ProviderHandle, TenantHandle, create_provider
from gpu_share.testing.rogue_agents import Honest
from gpu_share.testing.simulated_agent import (
    H100,
    AgentFactory,
    Behaviour,
    SimulatedAgent,
    inventory,
)
from gpu_share.testing.verification import mark_verified

RATE = 3_600_000  # 3.6 USDC per GPU-hour: a minute costs 0.06 USDC
RUNTIMES = [
    RuntimeName.ONNX_CUDA,
    RuntimeName.ONNX_CPU,
    RuntimeName.CATBOOST_CUDA,
    RuntimeName.CATBOOST_CPU,
]
_MACHINES = itertools.count(1)


@dataclass
class SpotCheckBench:
    app: FastAPI
    client: httpx.AsyncClient
    clock: FrozenClock
    provider: ProviderHandle
    sim_agent: AgentFactory
    agents: list[SimulatedAgent] = field(default_factory=list)  # made here: closed by the test
    nodes: list[SimulatedAgent] = field(default_factory=list)  # every node, kept online
    _jobs: "itertools.count[int]" = field(default_factory=lambda: itertools.count(1))

    @property
    def replica(self) -> Replica:
        replica: Replica = self.app.state.replica
        return replica

    async def node(self) -> SimulatedAgent:
        """A verified one-H100 node of the provider under test, priced at `RATE`."""
        agent = await self.sim_agent(
            inventory(runtimes=RUNTIMES, gpus=[H100], machine=f"m{next(_MACHINES)}"),
            verified=True,
        )
        await self._price(self.provider.id, agent)
        self.nodes.append(agent)
        return agent

    async def trusted_node(self, provider: ProviderHandle | None = None) -> SimulatedAgent:
        """A node of another provider (the platform's own machines), marked trusted."""
        owner = provider or await create_provider(self.client, f"Platform {next(_MACHINES)}")
        agent = SimulatedAgent(
            "http://testserver",
            transport=httpx.ASGITransport(app=self.app),
            node_inventory=inventory(
                runtimes=RUNTIMES, gpus=[H100], machine=f"trusted{next(_MACHINES)}"
            ),
        )
        await agent.register(owner.enrollment_token)
        self.agents.append(agent)
        assert agent.node_id is not None
        await mark_verified(self.replica, agent.node_id)
        await self.mark(agent, trusted=True)
        self.nodes.append(agent)
        return agent

    async def mark(self, agent: SimulatedAgent, *, trusted: bool) -> dict[str, Any]:
        answer = await self.client.post(
            f"/v1/admin/nodes/{agent.node_id}/trusted", json={"trusted": trusted}, headers=ADMIN
        )
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        return body

    async def _price(self, provider_id: str, agent: SimulatedAgent) -> None:
        async with self.replica.db.write() as session:
            await session.merge(
                ProviderPriceRow(
                    provider_id=provider_id,
                    gpu_model=H100.model,
                    price_micro_per_hour=RATE,
                    spot_discount_bps=5000,
                    updated_at=self.replica.clock.now(),
                )
            )
            node = await session.get(NodeRow, agent.node_id)
            assert node is not None
            node.price_per_gpu_hour_micro = RATE

    async def top_up(self, tenant: TenantHandle, amount: str = "100") -> None:
        answer = await self.client.post(
            f"/v1/admin/tenants/{tenant.id}/top-ups",
            json={"amount": amount, "reference": f"wire-{tenant.id}-{next(self._jobs)}"},
            headers=ADMIN,
        )
        assert answer.status_code in (200, 201), answer.text

    async def submit(
        self, tenant: TenantHandle, count: int = 1, runtime: str = "onnx_cuda"
    ) -> list[str]:
        """`count` jobs, each of its own model and inputs (their checksums name them); the
        nodes heartbeat first, so that they are online whatever time passed."""
        for node in self.nodes:
            await node.heartbeat()
        ids = []
        for _ in range(count):
            n = next(self._jobs)
            body = {
                "runtime": runtime,
                "model_url": f"https://models.example.com/{n}.onnx",
                "model_checksum_sha256": hashlib.sha256(f"model {n}".encode()).hexdigest(),
                "inputs_url": f"https://data.example.com/{n}.npz",
                "inputs_checksum_sha256": hashlib.sha256(f"inputs {n}".encode()).hexdigest(),
                "timeout_sec": 600,
            }
            answer = await self.client.post("/v1/gpu/invoke", json=body, headers=tenant.headers)
            assert answer.status_code == 202, answer.text
            ids.append(answer.json()["id"])
        return ids

    async def run(
        self, agent: SimulatedAgent, behaviour: Behaviour | None = None, seconds: float = 60
    ) -> list[str]:
        """Lease what the node gets, let `seconds` pass for each job, report it as
        `behaviour` answers (honestly by default), until it gets no more; the invokes it
        ran."""
        answer = behaviour or Honest()
        ran: list[str] = []
        while jobs := await agent.lease(slots=1, start=True):
            self.clock.advance(seconds)
            for job in jobs:
                await agent.client.report(job.invoke_id, await answer(job), retry_for=0)
                ran.append(job.invoke_id)
        return ran

    async def spot_pass(self) -> SpotCheckPass:
        return await spot_check_loop.run_once(self.replica)

    async def check_round(
        self, trusted: SimulatedAgent, behaviour: Behaviour | None = None
    ) -> list[SpotCheckPass]:
        """Pick, run the checks (and the confirmations) on `trusted` (honestly, or as
        `behaviour` answers), conclude: until no check is left running."""
        passes = [await self.spot_pass()]
        for _ in range(4):
            if not await self.run(trusted, behaviour, seconds=5):
                break
            passes.append(await self.spot_pass())
        return passes
