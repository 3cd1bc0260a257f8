"""Rate limits (SPEC §1.8 RATE_LIMITED): public forms and failed key lookups, per client
address, counted in the database so that every replica sees the same count."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
from fastapi import FastAPI

from gpu_share.coordinator.app import create_app
from gpu_share.coordinator.core.settings import Settings
from gpu_share.testing.clock import FrozenClock
from gpu_share.testing.factories import TenantHandle, bearer

APPLICATION = {
    "name": "Ivan Petrov",
    "email": "ivan@example.com",
    "intended_use": "Nightly CatBoost retraining",
}


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"rate_limit_applications": 3, "rate_limit_failed_keys": 5})


async def test_applications_from_one_address_are_limited_per_hour(
    client: httpx.AsyncClient, clock: FrozenClock
) -> None:
    for _ in range(3):
        assert (await client.post("/v1/tenant/applications", json=APPLICATION)).status_code == 201
    refused = await client.post("/v1/tenant/applications", json=APPLICATION)
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "RATE_LIMITED"
    assert 1 <= int(refused.headers["Retry-After"]) <= 3600
    clock.advance(3600)
    assert (await client.post("/v1/tenant/applications", json=APPLICATION)).status_code == 201


async def test_failed_key_lookups_lock_the_address_out_even_for_a_right_key(
    client: httpx.AsyncClient, tenant: TenantHandle, clock: FrozenClock
) -> None:
    for attempt in range(5):
        guess = await client.get("/v1/artifacts", headers=bearer(f"gpu_sk_guess{attempt}"))
        assert guess.status_code == 401
    refused = await client.get("/v1/artifacts", headers=bearer("gpu_sk_guess5"))
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) <= 60
    # a right guess now would be indistinguishable from a wrong one
    right = await client.get("/v1/gpu/invokes", headers=tenant.headers)
    assert right.status_code == 429
    clock.advance(60)
    assert (await client.get("/v1/gpu/invokes", headers=tenant.headers)).status_code == 200


@asynccontextmanager
async def replica(settings: Settings, clock: FrozenClock) -> AsyncIterator[httpx.AsyncClient]:
    app: FastAPI = create_app(settings, clock=clock)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http,
    ):
        yield http


async def test_replicas_share_the_count(settings: Settings, clock: FrozenClock) -> None:
    if not settings.database_url.startswith("postgresql"):
        pytest.skip("several replicas share a database on PostgreSQL only")
    async with replica(settings, clock) as first, replica(settings, clock) as second:
        for http in (first, second, first):
            assert (await http.post("/v1/tenant/applications", json=APPLICATION)).status_code == 201
        assert (await second.post("/v1/tenant/applications", json=APPLICATION)).status_code == 429
