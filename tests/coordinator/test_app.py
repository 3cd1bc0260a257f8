"""`create_app`: an app that has served and is dropped leaves nothing of itself behind.

FastAPI keeps facts about endpoint functions in module-level caches; an endpoint made
as a closure over the app would keep every app ever built alive there (a test run
builds thousands, and the collector walked them all, again and again)."""

import gc
import weakref

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy.exc import TimeoutError as PoolTimeout

from gpu_share.coordinator.app import create_app
from gpu_share.coordinator.core.settings import Settings
from gpu_share.testing.clock import FrozenClock


async def test_a_dropped_app_is_freed(settings: Settings, clock: FrozenClock) -> None:
    async def serve_once() -> weakref.ref[FastAPI]:
        app = create_app(settings, clock=clock)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                for path in ("/health", "/openapi.yaml", "/docs", "/signin"):
                    assert (await client.get(path)).status_code == 200, path
        return weakref.ref(app)

    gone = await serve_once()
    gc.collect()
    assert gone() is None, [type(r).__name__ for r in gc.get_referrers(gone())]


async def test_no_free_database_connection_is_503_not_500(app: FastAPI) -> None:
    """Overload: every pooled connection stayed busy for the pool's timeout."""

    async def saturated() -> None:
        raise PoolTimeout("QueuePool limit of size 10 overflow 20 reached")

    app.add_api_route("/test-saturated", saturated)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        response = await client.get("/test-saturated")
    assert response.status_code == 503
    assert response.headers["retry-after"] == "2"
    assert response.json()["error"]["code"] == "UNAVAILABLE"
    assert "overloaded" in response.json()["error"]["message"]


async def test_the_database_pool_is_sized_by_the_settings(
    settings: Settings, clock: FrozenClock
) -> None:
    if not settings.database_url.startswith("postgresql"):
        pytest.skip("SQLite's pool is its own (one file, one writer)")
    sized = settings.model_copy(update={"db_pool_size": 3, "db_max_overflow": 2})
    app = create_app(sized, clock=clock)
    async with app.router.lifespan_context(app):
        pool = app.state.replica.db.engine.pool
        assert (pool.size(), pool._max_overflow) == (3, 2)
