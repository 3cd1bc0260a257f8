"""Dedicated reservations for tests: a provider's GPU node priced per GPU-hour, a tenant's
top-up, a reservation asked for through the real API, and the tenant's balances in the
books. The `rentals` fixture (tests/conftest.py) holds one `Rentals`."""

from dataclasses import dataclass
from typing import Any

import httpx

from gpu_share.coordinator.core.orm import NodeRow, ProviderPriceRow
from gpu_share.coordinator.replica.state import Replica
from gpu_share.coordinator.services.money import ledger
from gpu_share.protocol.nodes import GpuInfo
from gpu_share.protocol.runtimes import RuntimeName
from gpu_share.testing.factories import ADMIN, ProviderHandle, TenantHandle
from gpu_share.testing.simulated_agent import H100, AgentFactory, SimulatedAgent, inventory

RATE = 2_000_000  # 2 USDC per GPU-hour
MODEL = H100.model


def gpus(count: int) -> list[GpuInfo]:
    return [
        H100.model_copy(update={"index": n, "uuid": f"GPU-{n:08d}-0000-0000-0000-000000000000"})
        for n in range(count)
    ]


@dataclass(frozen=True)
class Rentals:
    replica: Replica
    client: httpx.AsyncClient
    provider: ProviderHandle
    sim_agent: AgentFactory

    async def node(
        self, count: int = 2, *, verified: bool = True, **inventory_kw: Any
    ) -> SimulatedAgent:
        """A registered node with `count` H100s, its provider's price for them `RATE`;
        `verified`: they passed their hardware challenges (only verified GPUs are
        reserved, docs/trust.md)."""
        agent = await self.sim_agent(
            inventory(
                runtimes=[RuntimeName.ONNX_CUDA, RuntimeName.ONNX_CPU],
                gpus=gpus(count),
                **inventory_kw,
            ),
            verified=verified,
        )
        async with self.replica.db.write() as session:
            await session.merge(
                ProviderPriceRow(
                    provider_id=self.provider.id,
                    gpu_model=MODEL,
                    price_micro_per_hour=RATE,
                    spot_discount_bps=5000,
                    updated_at=self.replica.clock.now(),
                )
            )
            node = await session.get(NodeRow, agent.node_id)
            assert node is not None
            node.price_per_gpu_hour_micro = RATE
        return agent

    async def top_up(self, tenant: TenantHandle, amount: str) -> None:
        answer = await self.client.post(
            f"/v1/admin/tenants/{tenant.id}/top-ups",
            json={"amount": amount, "reference": f"wire-{tenant.id}"},
            headers=ADMIN,
        )
        assert answer.status_code in (200, 201), answer.text

    async def reserve(self, tenant: TenantHandle, **body: Any) -> httpx.Response:
        """`POST /v1/reservations` as the tenant, whatever the answer."""
        return await self.client.post("/v1/reservations", json=body, headers=tenant.headers)

    async def book(self, tenant: TenantHandle, node: SimulatedAgent, **body: Any) -> dict[str, Any]:
        """A reservation of `node` that must be made: the reservation."""
        made = await self.reserve(tenant, node_id=node.node_id, **body)
        assert made.status_code == 201, made.text
        reservation: dict[str, Any] = made.json()
        return reservation

    async def balances(self, tenant: TenantHandle) -> tuple[int, int]:
        """The tenant's available and reserved micro-USDC."""
        async with self.replica.db.read() as session:
            return (
                await ledger.balance(session, ledger.tenant_balance(tenant.id)),
                await ledger.balance(session, ledger.tenant_reserved(tenant.id)),
            )
