"""Dedicated reservations in free billing (docs/billing.md): cost 0, nothing posted."""

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import func, select

from gpu_share.coordinator.core.orm import LedgerTransactionRow
from gpu_share.coordinator.core.settings import BillingMode, Settings
from gpu_share.coordinator.loops import reservations as reservation_loop
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import TenantHandle
from gpu_share.testing.rentals import Rentals


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"billing": BillingMode.FREE})


async def test_a_free_reservation_costs_nothing_and_posts_nothing(
    app: FastAPI,
    client: httpx.AsyncClient,
    tenant: TenantHandle,
    rentals: Rentals,
    clock: FrozenClock,
) -> None:
    agent = await rentals.node(count=1)
    created = await client.post(
        "/v1/reservations", json={"node_id": agent.node_id, "hours": 2}, headers=tenant.headers
    )
    assert created.status_code == 201, created.text
    assert created.json()["cost"] == "0"
    clock.advance(2 * 3600)
    assert (await reservation_loop.run_once(app.state.replica)).ended == 1
    async with app.state.replica.db.read() as session:
        assert await session.scalar(select(func.count()).select_from(LedgerTransactionRow)) == 0
