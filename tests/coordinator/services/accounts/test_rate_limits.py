"""Rate limits (SPEC §1.8 RATE_LIMITED): public forms and failed key lookups, per client
address, counted in the database so that every replica sees the same count."""

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import func, select

from gpu_share.coordinator.app import create_app
from gpu_share.coordinator.core.orm import RateLimitRow
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


async def test_a_guesser_gets_429_but_a_valid_key_from_its_address_still_works(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle, clock: FrozenClock
) -> None:
    for attempt in range(5):
        guess = await client.get("/v1/artifacts", headers=bearer(f"gpu_sk_guess{attempt}"))
        assert guess.status_code == 401
    refused = await client.get("/v1/artifacts", headers=bearer("gpu_sk_guess5"))
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) <= 60
    assert refused.json()["error"]["code"] == "RATE_LIMITED"
    # Someone else behind the same address, with a key no replica has seen yet.
    app.state.replica.key_cache.clear()
    assert (await client.get("/v1/gpu/invokes", headers=tenant.headers)).status_code == 200
    assert (await client.get("/v1/artifacts", headers=bearer("gpu_sk_guess6"))).status_code == 429
    clock.advance(60)
    assert (await client.get("/v1/artifacts", headers=bearer("gpu_sk_guess7"))).status_code == 401


async def failed_lookups_counted(app: FastAPI, client: str) -> int:
    async with app.state.replica.db.read() as session:
        hits = await session.scalar(
            select(func.sum(RateLimitRow.hits)).where(RateLimitRow.key == f"failed-keys:{client}")
        )
    return int(hits or 0)


async def test_concurrent_guesses_are_counted_exactly_and_never_lock_out_a_valid_key(
    app: FastAPI, client: httpx.AsyncClient, tenant: TenantHandle
) -> None:
    app.state.replica.key_cache.clear()

    async def guess(attempt: int) -> int:
        answer = await client.get("/v1/artifacts", headers=bearer(f"gpu_sk_guess{attempt}"))
        return answer.status_code

    async def valid() -> int:
        return (await client.get("/v1/gpu/invokes", headers=tenant.headers)).status_code

    answers = await asyncio.gather(
        *(guess(attempt) for attempt in range(300)), *(valid() for _ in range(10))
    )
    guesses, valids = answers[:300], answers[300:]
    assert await failed_lookups_counted(app, "127.0.0.1") == 300
    assert guesses.count(401) == 5 and guesses.count(429) == 295
    assert valids == [200] * 10
    assert (await client.get("/v1/artifacts", headers=bearer("gpu_sk_more"))).status_code == 429
    app.state.replica.key_cache.clear()
    assert await valid() == 200


@pytest.mark.parametrize("trusted", [[], ["127.0.0.0/8"]])
async def test_x_forwarded_for_names_the_client_only_behind_a_trusted_proxy(
    settings: Settings, clock: FrozenClock, trusted: list[str]
) -> None:
    """The test client connects from 127.0.0.1; a guesser writes a new address each try."""
    async with replica(settings.model_copy(update={"trusted_proxies": trusted}), clock) as http:
        answers = [
            await http.get(
                "/v1/artifacts",
                headers={**bearer(f"gpu_sk_guess{n}"), "X-Forwarded-For": f"203.0.113.{n}"},
            )
            for n in range(7)
        ]
        statuses = [answer.status_code for answer in answers]
        if trusted:  # seven clients, one guess each
            assert statuses == [401] * 7
        else:  # one client: the proxy's header is a guesser's word
            assert statuses == [401] * 5 + [429] * 2


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
